//! Connection management with rdma_cm's model: event channels, ids bound
//! to IP addresses, listen/connect/accept/reject/disconnect with private
//! data, UD ids resolved through SIDR. The protocol is the IB CM over QP1
//! (`roxe_provider::cm`), wire-compatible with the kernel's rdma_cm.
//!
//! A roxe device is an IP address, so binding or resolving an address
//! picks the device: [`CmId::bind_addr`] uses (or opens) the device at that
//! address; [`CmId::resolve_addr`] without a source uses the process's
//! default device (`ROXE_ADDR`, else the first free 127.0.0.N).
//!
//! As in librdmacm, the QP transitions happen while events are taken: a
//! REP moves the active side's QP to RTR and RTS, sends the RTU and is
//! reported as [`EventKind::Established`]; [`CmId::accept`] moves the
//! passive side's QP before the REP leaves.
//!
//! ```no_run
//! use roxe_verbs::cm::*;
//! let ch = EventChannel::new()?;
//! let id = CmId::new(&ch, PortSpace::Tcp);
//! id.resolve_addr(None, "127.0.0.1:7471".parse().unwrap())?;
//! assert_eq!(ch.get_event()?.kind, EventKind::AddrResolved);
//! # Ok::<(), roxe_verbs::Error>(())
//! ```

use crate::{
    io, open_at, verbs, AccessFlags, AddressVector, AttrMask, Context, Errno, Pd, Qp, QpAttr,
    QpInit, QpState, QpType, Result,
};
use parking_lot::Mutex;
use roxe_provider::cm::{self as pcm, CmEvent, ConnId, ConnParams, RocePath};
use roxe_provider::wire::cm::{rdma_cm, reason, RepRepr, ReqRepr};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// The Q_Key rdma_cm gives UD QPs (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// Private data a REQ leaves the user after rdma_cm's 36-byte header.
pub const MAX_CONNECT_PRIVATE_DATA: usize = 92 - rdma_cm::CMA_HEADER_LEN;
/// Private data of a REP.
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Private data of a REJ.
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;

/// rdma_cm's port spaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections (RC).
    Tcp,
    /// `RDMA_PS_UDP`: UD, resolved through SIDR.
    Udp,
    /// `RDMA_PS_IB`: any QP type.
    Ib,
}

impl PortSpace {
    fn code(self) -> u16 {
        match self {
            PortSpace::Tcp => rdma_cm::PS_TCP,
            PortSpace::Udp => rdma_cm::PS_UDP,
            PortSpace::Ib => rdma_cm::PS_IB,
        }
    }
    fn is_ud(self) -> bool {
        self == PortSpace::Udp
    }
}

/// `enum rdma_cm_event_type`, numbered as in `rdma_cma.h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum EventKind {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`.
    AddrResolved = 0,
    /// `RDMA_CM_EVENT_ADDR_ERROR`.
    AddrError = 1,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    RouteResolved = 2,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`.
    RouteError = 3,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`.
    ConnectRequest = 4,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE` (an id without a QP got the REP).
    ConnectResponse = 5,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`.
    ConnectError = 6,
    /// `RDMA_CM_EVENT_UNREACHABLE`.
    Unreachable = 7,
    /// `RDMA_CM_EVENT_REJECTED` (status: the REJ reason).
    Rejected = 8,
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    Established = 9,
    /// `RDMA_CM_EVENT_DISCONNECTED`.
    Disconnected = 10,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`.
    TimewaitExit = 15,
}

/// `struct rdma_conn_param`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data to send / as received (rdma_cm's header removed).
    pub private_data: Vec<u8>,
    /// READs/atomics the peer may have outstanding at us.
    pub responder_resources: u8,
    /// READs/atomics we may have outstanding at the peer.
    pub initiator_depth: u8,
    /// Transport retries (0..=7).
    pub retry_count: u8,
    /// RNR retries (7: infinite).
    pub rnr_retry_count: u8,
    /// The peer's QPN (received), or the QPN to announce for an id without
    /// a QP.
    pub qp_num: u32,
    /// The peer's QP uses an SRQ (received).
    pub srq: bool,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            qp_num: 0,
            srq: false,
        }
    }
}

/// What a UD id learns (`struct rdma_ud_param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdParam {
    /// The remote UD QP.
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// How to reach it.
    pub ah_attr: AddressVector,
    /// Private data.
    pub private_data: Vec<u8>,
}

/// One answer of [`getaddrinfo`] (`struct rdma_addrinfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrInfo {
    /// `RAI_PASSIVE`: `src` is the address to bind and listen on.
    pub passive: bool,
    /// The address to bind (passive) or the source given in `hints`.
    pub src: Option<SocketAddr>,
    /// The address to connect to (active).
    pub dst: Option<SocketAddr>,
    /// The port space (from `hints`).
    pub port_space: PortSpace,
    /// The QP type the port space implies (UD for [`PortSpace::Udp`]).
    pub qp_type: QpType,
}

/// `rdma_getaddrinfo`: resolve `node` (a name or a numeric address; None
/// with `passive`: the wildcard) and `service` (a port number) into addresses for `rdma_bind_addr` (passive) or
/// `rdma_resolve_addr` (active), in `port_space`, IPv4 and IPv6 answers
/// both. `src` is carried into active answers as their source.
pub fn getaddrinfo(
    node: Option<&str>,
    service: &str,
    passive: bool,
    port_space: PortSpace,
    src: Option<SocketAddr>,
) -> Result<Vec<AddrInfo>> {
    const VERB: &str = "rdma_getaddrinfo";
    let port: u16 = service.parse().map_err(|_| {
        verbs(
            VERB,
            Errno::EINVAL,
            format!("{service:?} is not a port number"),
        )
    })?;
    let addrs: Vec<SocketAddr> = match node {
        None if passive => vec![SocketAddr::new(IpAddr::from([0u8; 4]), port)],
        None => vec![SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port)],
        Some(n) => (n, port)
            .to_socket_addrs()
            .map_err(|e| verbs(VERB, Errno(2), format!("{n}: {e}")))?
            .collect(),
    };
    let qp_type = if port_space.is_ud() {
        QpType::Ud
    } else {
        QpType::Rc
    };
    let mut out: Vec<AddrInfo> = Vec::new();
    for a in addrs {
        let info = if passive {
            AddrInfo {
                passive,
                src: Some(a),
                dst: None,
                port_space,
                qp_type,
            }
        } else {
            AddrInfo {
                passive,
                src,
                dst: Some(a),
                port_space,
                qp_type,
            }
        };
        if !out.contains(&info) {
            out.push(info);
        }
    }
    Ok(out)
}

/// `struct rdma_cm_event`.
#[derive(Debug, Clone)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The id it happened to (for `ConnectRequest`: the new id).
    pub id: CmId,
    /// `ConnectRequest`: the listening id.
    pub listen_id: Option<CmId>,
    /// `Rejected`: the REJ reason; otherwise 0 or a negative errno.
    pub status: i32,
    /// Connection parameters (`ConnectRequest`, `ConnectResponse`,
    /// `Established`, `Rejected`, `Disconnected`).
    pub param: ConnParam,
    /// UD ids: the resolved remote QP.
    pub ud: Option<UdParam>,
}

/// An event waiting in a channel. The id is weak: a queue (and the
/// progress thread that fills it) must never hold the last reference, as
/// dropping an id frees its QP, which takes the device lock.
struct Queued {
    id: Weak<IdInner>,
    raw: Raw,
}

enum Raw {
    Local(EventKind),
    Cm(CmEvent),
}

struct ChannelInner {
    queue: Mutex<VecDeque<Queued>>,
    tx: UnixDatagram,
    rx: UnixDatagram,
}

impl ChannelInner {
    /// Queue an event. The fd is readable exactly while the queue holds
    /// events: one byte is written when the queue stops being empty and
    /// drained when it empties (both under the queue lock), so no burst of
    /// events can fill the socket and leave events without a wake-up.
    fn push(&self, q: Queued) {
        let mut queue = self.queue.lock();
        let was_empty = queue.is_empty();
        queue.push_back(q);
        if was_empty {
            let _ = self.tx.send(&[1]);
        }
    }

    /// The next queued event, if any.
    fn pop(&self) -> Option<Queued> {
        let mut queue = self.queue.lock();
        let q = queue.pop_front();
        if queue.is_empty() {
            self.drain_wakeup();
        }
        q
    }

    /// Read the wake-up byte (call with the queue lock held, queue empty).
    fn drain_wakeup(&self) {
        let mut b = [0u8; 8];
        while let Ok((n, _)) = rustix::net::recv(&self.rx, &mut b, rustix::net::RecvFlags::DONTWAIT)
        {
            if n == 0 {
                break;
            }
        }
    }
}

/// `struct rdma_event_channel`: events of the ids created on it, with a
/// pollable fd (`AsFd`).
#[derive(Clone)]
pub struct EventChannel {
    inner: Arc<ChannelInner>,
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel").finish_non_exhaustive()
    }
}

impl EventChannel {
    /// `rdma_create_event_channel`.
    pub fn new() -> Result<EventChannel> {
        let (tx, rx) = UnixDatagram::pair().map_err(io("rdma_create_event_channel"))?;
        tx.set_nonblocking(true)
            .map_err(io("rdma_create_event_channel"))?;
        Ok(EventChannel {
            inner: Arc::new(ChannelInner {
                queue: Mutex::new(VecDeque::new()),
                tx,
                rx,
            }),
        })
    }

    /// `rdma_get_cm_event`: wait for the next event (with the channel
    /// non-blocking: EAGAIN when none is pending).
    pub fn get_event(&self) -> Result<Event> {
        let mut b = [0u8; 1];
        loop {
            if let Some(ev) = self.try_get_event()? {
                return Ok(ev);
            }
            // Wait until an event is queued: a peek blocks unless the fd
            // was made non-blocking (then EAGAIN, as librdmacm's read).
            match rustix::net::recv(&self.inner.rx, &mut b, rustix::net::RecvFlags::PEEK) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(io("rdma_get_cm_event")(e.into())),
            }
        }
    }

    /// The next event if one is pending, without waiting.
    pub fn try_get_event(&self) -> Result<Option<Event>> {
        // Events of ids dropped since they were queued are skipped.
        while let Some(q) = self.inner.pop() {
            if let Some(ev) = process(q)? {
                tracing::debug!(
                    event = ?ev.kind,
                    status = ev.status,
                    qpn = ev.param.qp_num,
                    "rdma_cm event"
                );
                return Ok(Some(ev));
            }
        }
        Ok(None)
    }

    /// Wait at most `timeout` for the next event.
    pub fn get_event_timeout(&self, timeout: Duration) -> Result<Option<Event>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.try_get_event()? {
                return Ok(Some(e));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let ts = rustix::time::Timespec {
                tv_sec: left.as_secs() as _,
                tv_nsec: left.subsec_nanos() as _,
            };
            let mut fds = [rustix::event::PollFd::new(
                &self.inner.rx,
                rustix::event::PollFlags::IN,
            )];
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(io("rdma_get_cm_event")(e.into())),
            }
        }
    }

    /// Make [`get_event`](Self::get_event) fail with EAGAIN instead of
    /// waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        self.inner
            .rx
            .set_nonblocking(nonblocking)
            .map_err(io("fcntl"))
    }
}

impl std::os::fd::AsFd for EventChannel {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.rx.as_fd()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdState {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listening,
    Connecting,
    /// Passive: a REQ awaits accept or reject.
    Requested,
    Accepting,
    Connected,
    Disconnected,
    Rejected,
}

struct IdState2 {
    state: IdState,
    ctx: Option<Context>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    qp: Option<Qp>,
    pd: Option<Pd>,
    conn: Option<ConnId>,
    listen: Option<pcm::ListenId>,
    /// The REQ of a passive id (its path, PSN, QPN).
    req: Option<Box<ReqRepr>>,
    /// Our offer (for the QP transitions after the REP).
    offer: Option<ConnParam>,
    /// The REP an active id received (its QP's RTR/RTS attributes).
    rep: Option<Box<RepRepr>>,
    /// `RDMA_OPTION_ID_TOS`: the traffic class of the path and QP.
    tos: u8,
    psn: u32,
    ack_timeout: u8,
    /// CM response timeout exponent and retries for this id's REQ.
    cm_timeout: (u8, u8),
    /// The active side reported Established with the REP: the CM's own
    /// Established (raised by `establish`) is not reported again.
    established_reported: bool,
}

impl IdState2 {
    /// A fresh id's state: `ack_timeout` 19 and CM timeouts (20, 15) as
    /// the kernel's rdma_cm over RoCE, a random initial PSN.
    fn new(state: IdState) -> IdState2 {
        IdState2 {
            state,
            ctx: None,
            local: None,
            peer: None,
            qp: None,
            pd: None,
            conn: None,
            listen: None,
            req: None,
            offer: None,
            rep: None,
            tos: 0,
            psn: random_u32() & 0xff_ffff,
            ack_timeout: 19,
            cm_timeout: (20, 15),
            established_reported: false,
        }
    }
}

struct IdInner {
    /// Replaced by [`CmId::migrate`].
    channel: Mutex<Arc<ChannelInner>>,
    ps: PortSpace,
    st: Mutex<IdState2>,
}

/// `struct rdma_cm_id`.
#[derive(Clone)]
pub struct CmId {
    inner: Arc<IdInner>,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.st.lock();
        f.debug_struct("CmId")
            .field("state", &st.state)
            .field("local", &st.local)
            .field("peer", &st.peer)
            .finish()
    }
}

impl PartialEq for CmId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// Routes a device's CM events to the ids in this process.
#[derive(Default)]
struct Router {
    routes: Mutex<Routes>,
}

#[derive(Default)]
struct Routes {
    /// The id (weak, see `Queued`) and its channel.
    ids: HashMap<u32, (Weak<IdInner>, Weak<ChannelInner>)>,
    /// Events for a connection whose id is not registered yet (the REJ of
    /// a REQ can overtake the registration).
    early: HashMap<u32, Vec<CmEvent>>,
}

struct DeviceCm {
    router: Arc<Router>,
    _sink: Arc<roxe_provider::driver::CmEventSink>,
}

/// A device (weak: a closed device's entry is replaced) and its router.
type RouterEntry = (Weak<roxe_provider::driver::Device>, DeviceCm);

/// The CM router of a context's soft device (rdma_cm runs on soft
/// devices: ids open them by address).
fn device_cm(ctx: &Context) -> Result<Arc<Router>> {
    static ROUTERS: OnceLock<Mutex<HashMap<IpAddr, RouterEntry>>> = OnceLock::new();
    let device = ctx.soft_arc("rdma_cm")?;
    let mut all = ROUTERS.get_or_init(Default::default).lock();
    let addr = ctx.addr();
    let dev = Arc::downgrade(device);
    if let Some((d, cm)) = all.get(&addr) {
        if Weak::ptr_eq(d, &dev) {
            return Ok(Arc::clone(&cm.router));
        }
    }
    let router = Arc::new(Router::default());
    let weak = Arc::downgrade(&router);
    let sink: Arc<roxe_provider::driver::CmEventSink> = Arc::new(move |ev: CmEvent| {
        if let Some(r) = weak.upgrade() {
            r.dispatch(ev);
        }
    });
    device.subscribe_cm_events(&sink);
    all.insert(
        addr,
        (
            dev,
            DeviceCm {
                router: Arc::clone(&router),
                _sink: sink,
            },
        ),
    );
    Ok(router)
}

impl Router {
    fn dispatch(&self, ev: CmEvent) {
        let key = match &ev {
            CmEvent::ConnectRequest { listen, .. } | CmEvent::SidrRequest { listen, .. } => *listen,
            e => e.conn(),
        };
        let mut r = self.routes.lock();
        match r.ids.get(&key) {
            // A channel's drop frees only queued events and sockets: safe
            // here, under the device lock.
            Some((id, ch)) => {
                if let Some(ch) = ch.upgrade() {
                    deliver(&ch, id.clone(), ev);
                }
            }
            None => r.early.entry(key).or_default().push(ev),
        }
    }

    fn register(&self, key: u32, id: &Arc<IdInner>) {
        let mut r = self.routes.lock();
        let channel = Arc::clone(&id.channel.lock());
        r.ids
            .insert(key, (Arc::downgrade(id), Arc::downgrade(&channel)));
        for ev in r.early.remove(&key).unwrap_or_default() {
            deliver(&channel, Arc::downgrade(id), ev);
        }
    }

    fn unregister(&self, key: u32) {
        let mut r = self.routes.lock();
        r.ids.remove(&key);
        r.early.remove(&key);
    }
}

fn deliver(channel: &ChannelInner, id: Weak<IdInner>, ev: CmEvent) {
    channel.push(Queued {
        id,
        raw: Raw::Cm(ev),
    });
}

fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    h.finish() as u32
}

fn gid(addr: IpAddr) -> [u8; 16] {
    roxe_provider::engine::gid_of(addr)
}

fn cm_err(verb: &'static str, detail: &str) -> crate::Error {
    verbs(verb, Errno::EINVAL, detail)
}

impl CmId {
    /// `rdma_create_id` on `channel` in port space `ps`.
    pub fn new(channel: &EventChannel, ps: PortSpace) -> CmId {
        CmId {
            inner: Arc::new(IdInner {
                channel: Mutex::new(Arc::clone(&channel.inner)),
                ps,
                st: Mutex::new(IdState2::new(IdState::Idle)),
            }),
        }
    }

    /// The device the id is bound to (`id->verbs`), once bound or resolved.
    pub fn context(&self) -> Option<Context> {
        self.inner.st.lock().ctx.clone()
    }

    /// The id's QP (`id->qp`).
    pub fn qp(&self) -> Option<Qp> {
        self.inner.st.lock().qp.clone()
    }

    /// The id's PD (`id->pd`).
    pub fn pd(&self) -> Option<Pd> {
        self.inner.st.lock().pd.clone()
    }

    /// `rdma_get_local_addr`.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.st.lock().local
    }

    /// `rdma_get_peer_addr`.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.inner.st.lock().peer
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.inner.ps
    }

    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`: the QP's local ACK
    /// timeout exponent (default 19, as the kernel's rdma_cm over RoCE).
    pub fn set_ack_timeout(&self, timeout: u8) -> Result<()> {
        if timeout > 31 {
            return Err(cm_err("rdma_set_option", "ACK timeout above 31"));
        }
        self.inner.st.lock().ack_timeout = timeout;
        Ok(())
    }

    /// How long this id's REQ waits for an answer (4.096 µs × 2^`timeout`,
    /// default 20 as rdma_cm's CMA_CM_RESPONSE_TIMEOUT) and how often it is
    /// resent (default 15, CMA_MAX_CM_RETRIES) before `Unreachable`.
    pub fn set_cm_timeouts(&self, timeout: u8, retries: u8) -> Result<()> {
        if timeout > 31 || retries > 15 {
            return Err(cm_err(
                "rdma_set_option",
                "CM timeout above 31 or retries above 15",
            ));
        }
        self.inner.st.lock().cm_timeout = (timeout, retries);
        Ok(())
    }

    /// `rdma_bind_addr`: the device at `addr`'s IP (opened if need be),
    /// port `addr.port()` (0: an ephemeral one). A wildcard address binds
    /// the process's default device.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        const VERB: &str = "rdma_bind_addr";
        let mut st = self.inner.st.lock();
        if st.state != IdState::Idle {
            return Err(cm_err(VERB, "id already bound"));
        }
        let ctx = if addr.ip().is_unspecified() || loopback_means_default(addr.ip())? {
            default_context()?
        } else if let Some(configured) = configured_elsewhere(addr.ip())? {
            return Err(verbs(
                VERB,
                Errno(19),
                format!(
                    "{} is the address of no roxe device (ROXE_ADDR={configured})",
                    addr.ip()
                ),
            ));
        } else {
            open_at(addr.ip()).map_err(|e| match &e {
                crate::Error::Io { source, .. } => {
                    let errno = match source.kind() {
                        std::io::ErrorKind::AddrNotAvailable => 99,
                        std::io::ErrorKind::AddrInUse => 98,
                        _ => return e,
                    };
                    verbs(VERB, Errno(errno), e.to_string())
                }
                _ => e,
            })?
        };
        let port = if addr.port() == 0 {
            ephemeral_port()
        } else {
            addr.port()
        };
        st.local = Some(SocketAddr::new(ctx.addr(), port));
        st.ctx = Some(ctx);
        st.state = IdState::Bound;
        Ok(())
    }

    /// `rdma_resolve_addr`: pick the source device (`src`, the bound one,
    /// or the default) for `dst`; raises [`EventKind::AddrResolved`].
    pub fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr) -> Result<()> {
        const VERB: &str = "rdma_resolve_addr";
        if let Some(s) = src {
            if self.inner.st.lock().state == IdState::Idle {
                self.bind_addr(s)?;
            }
        }
        let mut st = self.inner.st.lock();
        match st.state {
            IdState::Idle => {
                let ctx = default_context()?;
                st.local = Some(SocketAddr::new(ctx.addr(), ephemeral_port()));
                st.ctx = Some(ctx);
            }
            IdState::Bound => {}
            _ => return Err(cm_err(VERB, "id not idle or bound")),
        }
        let local = st.local.map(|l| l.ip());
        if local.is_some_and(|l| l.is_ipv4() != dst.is_ipv4()) {
            return Err(verbs(VERB, Errno(97), "address families differ"));
        }
        st.peer = Some(dst);
        st.state = IdState::AddrResolved;
        drop(st);
        self.channel().push(Queued {
            id: Arc::downgrade(&self.inner),
            raw: Raw::Local(EventKind::AddrResolved),
        });
        Ok(())
    }

    /// `rdma_resolve_route`: RoCE needs no path query; raises
    /// [`EventKind::RouteResolved`].
    pub fn resolve_route(&self) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.state != IdState::AddrResolved {
            return Err(cm_err("rdma_resolve_route", "address not resolved"));
        }
        st.state = IdState::RouteResolved;
        drop(st);
        self.channel().push(Queued {
            id: Arc::downgrade(&self.inner),
            raw: Raw::Local(EventKind::RouteResolved),
        });
        Ok(())
    }

    /// `rdma_listen`: take REQs (or SIDR_REQs, for UDP) to the bound port.
    /// EADDRINUSE if the port already has a listener on this device.
    /// `backlog` (≤ 0: 1024) bounds the requests not yet accepted or
    /// rejected; further REQs are dropped and resent by their requesters.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.state == IdState::Idle {
            drop(st);
            self.bind_addr(SocketAddr::new(IpAddr::from([0, 0, 0, 0]), 0))?;
            st = self.inner.st.lock();
        }
        if st.state != IdState::Bound {
            return Err(cm_err("rdma_listen", "id not bound"));
        }
        let (Some(ctx), Some(local)) = (st.ctx.clone(), st.local) else {
            return Err(cm_err("rdma_listen", "id not bound"));
        };
        let sid = rdma_cm::service_id(self.inner.ps.code(), local.port());
        let dev = ctx.soft("rdma_cm")?;
        dev.claim_service(sid).map_err(|e| {
            let errno = if e.kind() == std::io::ErrorKind::AddrInUse {
                98
            } else {
                5
            };
            verbs("rdma_listen", Errno(errno), e.to_string())
        })?;
        let lid = {
            let mut e = dev.engine();
            let lid = match e.cm().listen(sid) {
                Ok(l) => l,
                Err(err) => {
                    drop(e);
                    dev.release_service(sid);
                    return Err(err.into());
                }
            };
            let backlog = if backlog <= 0 { 1024 } else { backlog as u32 };
            e.cm().set_backlog(lid, backlog);
            lid
        };
        device_cm(&ctx)?.register(lid, &self.inner);
        st.listen = Some(lid);
        st.state = IdState::Listening;
        Ok(())
    }

    /// `rdma_create_qp`: a QP on the id's device, brought to INIT (UD: to
    /// RTS with Q_Key `RDMA_UDP_QKEY`), as librdmacm does. With `pd`
    /// `None`, a PD of the device's own.
    pub fn create_qp(&self, pd: Option<&Pd>, init: &QpInit<'_>) -> Result<Qp> {
        const VERB: &str = "rdma_create_qp";
        let ctx = self
            .context()
            .ok_or_else(|| cm_err(VERB, "id has no device"))?;
        let pd = match pd {
            Some(p) => p.clone(),
            None => ctx.alloc_pd()?,
        };
        if pd.context().addr() != ctx.addr() {
            return Err(cm_err(VERB, "PD of another device"));
        }
        let qp = pd.create_qp(init)?;
        self.attach_qp(&qp, &pd)?;
        Ok(qp)
    }

    /// Make `qp` (created on the id's device by other means, as the
    /// drop-in librdmacm's `rdma_create_qp` does) the id's QP, brought to
    /// INIT (UD: to RTS with rdma_cm's Q_Key). EINVAL if the id already has
    /// a QP or `qp` is of another device.
    pub fn attach_qp(&self, qp: &Qp, pd: &Pd) -> Result<()> {
        const VERB: &str = "rdma_create_qp";
        let ctx = self
            .context()
            .ok_or_else(|| cm_err(VERB, "id has no device"))?;
        if pd.context().addr() != ctx.addr() {
            return Err(cm_err(VERB, "PD of another device"));
        }
        if self.inner.st.lock().qp.is_some() {
            return Err(cm_err(VERB, "the id already has a QP"));
        }
        if qp.qp_type() == QpType::Ud {
            qp.ready_ud(RDMA_UDP_QKEY, random_u32() & 0xff_ffff)?;
        } else {
            let (a, m) = init_attr(false);
            qp.modify(&a, m)?;
        }
        let mut st = self.inner.st.lock();
        st.qp = Some(qp.clone());
        st.pd = Some(pd.clone());
        Ok(())
    }

    /// `rdma_destroy_qp`: the id forgets its QP (returned).
    pub fn detach_qp(&self) -> Option<Qp> {
        self.inner.st.lock().qp.take()
    }

    /// A key that identifies this id (and its clones) for as long as it
    /// lives: the drop-in librdmacm maps ids to its C objects with it.
    pub fn key(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// `rdma_set_option(RDMA_OPTION_ID_TOS)`: the traffic class of the
    /// connection's packets.
    pub fn set_tos(&self, tos: u8) {
        self.inner.st.lock().tos = tos;
    }

    /// `rdma_init_qp_attr`: the attributes (and mask) that move a QP of
    /// this id to `state` (INIT, RTR or RTS), for programs that move their
    /// QP themselves. RTR and RTS need the REQ (passive) or REP (active):
    /// EINVAL before.
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, AttrMask)> {
        const VERB: &str = "rdma_init_qp_attr";
        let st = self.inner.st.lock();
        let ctx = st
            .ctx
            .clone()
            .ok_or_else(|| cm_err(VERB, "id has no device"))?;
        if state == QpState::Init {
            return Ok(init_attr(self.inner.ps.is_ud()));
        }
        if self.inner.ps.is_ud() {
            return Err(cm_err(VERB, "UD QPs go to RTR and RTS without attributes"));
        }
        let plan = if let Some(rep) = &st.rep {
            active_plan(&st, &ctx, rep)?
        } else if let Some(req) = &st.req {
            passive_plan(&st, &ctx, req, req.initiator_depth, req.responder_resources)?
        } else {
            return Err(cm_err(VERB, "no REQ or REP yet"));
        };
        match state {
            QpState::Rtr => Ok(rtr_attr(&plan)),
            QpState::Rts => Ok(rts_attr(&plan)),
            _ => Err(cm_err(VERB, "only INIT, RTR and RTS")),
        }
    }

    /// `rdma_establish`: an active id without a QP got `ConnectResponse`
    /// and has moved its QP itself: send the RTU.
    pub fn establish(&self) -> Result<()> {
        const VERB: &str = "rdma_establish";
        let mut st = self.inner.st.lock();
        if st.qp.is_some() {
            return Err(cm_err(
                VERB,
                "the id has a QP (its REP already sent the RTU)",
            ));
        }
        let ctx = st.ctx.clone().ok_or_else(|| cm_err(VERB, "no device"))?;
        let conn = st.conn.ok_or_else(|| cm_err(VERB, "not connecting"))?;
        ctx.soft("rdma_cm")?.engine().cm().establish(conn, &[])?;
        st.state = IdState::Connected;
        // As the kernel's: the active side's last event was
        // CONNECT_RESPONSE; the RTU it sends raises none (UCX's connection
        // manager takes an ESTABLISHED there for a server's).
        st.established_reported = true;
        Ok(())
    }

    /// `rdma_migrate_id`: the id's future events (and those waiting in its
    /// old channel) go to `channel`.
    pub fn migrate(&self, channel: &EventChannel) {
        let old = std::mem::replace(&mut *self.inner.channel.lock(), Arc::clone(&channel.inner));
        let (ctx, keys) = {
            let st = self.inner.st.lock();
            (st.ctx.clone(), [st.conn, st.listen])
        };
        if let Some(router) = ctx.and_then(|c| device_cm(&c).ok()) {
            for k in keys.into_iter().flatten() {
                router.register(k, &self.inner);
            }
        }
        let moved: Vec<Queued> = {
            let mut q = old.queue.lock();
            let (mine, rest): (VecDeque<Queued>, VecDeque<Queued>) = q
                .drain(..)
                .partition(|e| std::ptr::eq(e.id.as_ptr(), Arc::as_ptr(&self.inner)));
            *q = rest;
            if q.is_empty() {
                old.drain_wakeup();
            }
            mine.into()
        };
        for e in moved {
            channel.inner.push(e);
        }
    }

    /// `rdma_reject` with an explicit REJ reason (rdma_reject_ece: 35,
    /// vendor option not supported).
    pub fn reject_with_reason(&self, private_data: &[u8], reason: u16) -> Result<()> {
        self.reject_inner(private_data, reason)
    }

    fn channel(&self) -> Arc<ChannelInner> {
        Arc::clone(&self.inner.channel.lock())
    }

    fn path(st: &IdState2, ctx: &Context) -> Result<RocePath> {
        let peer = st
            .peer
            .ok_or_else(|| cm_err("rdma_connect", "no destination"))?;
        let mtu = ctx.query_port(1)?.active_mtu;
        let src_port = st.local.map_or(0, |l| l.port());
        Ok(RocePath {
            local_gid: gid(ctx.addr()),
            remote_gid: gid(peer.ip()),
            path_mtu: mtu as u8,
            local_ack_timeout: st.ack_timeout,
            flow_label: rdma_cm::roce_flow_label(src_port, peer.port()),
            traffic_class: st.tos,
            packet_rate: 0,
        })
    }

    /// `rdma_connect`: send the REQ (UDP ids: the SIDR_REQ). The answer
    /// comes as `Established` (with a QP, or a UD id), `ConnectResponse`
    /// (no QP), `Rejected` or `Unreachable`.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        const VERB: &str = "rdma_connect";
        let mut st = self.inner.st.lock();
        if st.state != IdState::RouteResolved {
            return Err(cm_err(VERB, "route not resolved"));
        }
        if param.private_data.len() > MAX_CONNECT_PRIVATE_DATA && !self.inner.ps.is_ud() {
            return Err(cm_err(VERB, "private data longer than 56 bytes"));
        }
        let ctx = st.ctx.clone().ok_or_else(|| cm_err(VERB, "no device"))?;
        let (Some(local), Some(peer)) = (st.local, st.peer) else {
            return Err(cm_err(VERB, "addresses not resolved"));
        };
        let hdr = rdma_cm::CmaHeader {
            cma_version: 0,
            ip_version: if local.is_ipv4() { 4 } else { 6 },
            port: local.port(),
            src: local.ip(),
            dst: peer.ip(),
        };
        let mut pd = vec![0u8; rdma_cm::CMA_HEADER_LEN];
        hdr.emit(&mut pd)
            .map_err(|e| cm_err(VERB, &e.to_string()))?;
        pd.extend_from_slice(&param.private_data);
        let sid = rdma_cm::service_id(self.inner.ps.code(), peer.port());
        let router = device_cm(&ctx)?;
        let now = ctx.soft("rdma_cm")?.now();
        let conn = if self.inner.ps.is_ud() {
            ctx.soft("rdma_cm")?
                .engine()
                .cm()
                .sidr_request(now, peer.ip(), sid, &pd)?
        } else {
            let qpn = st.qp.as_ref().map(Qp::qp_num).unwrap_or(param.qp_num);
            let offer = ConnParams {
                qpn,
                psn: st.psn,
                responder_resources: param.responder_resources,
                initiator_depth: param.initiator_depth,
                retry_count: param.retry_count,
                rnr_retry_count: param.rnr_retry_count,
                srq: false,
                private_data: pd,
            };
            let mut req = pcm::rocev2_req(sid, &Self::path(&st, &ctx)?, &offer)?;
            (req.remote_cm_response_timeout, req.max_cm_retries) = st.cm_timeout;
            req.local_cm_response_timeout = st.cm_timeout.0;
            ctx.soft("rdma_cm")?
                .engine()
                .cm()
                .connect(now, peer.ip(), req)
        };
        router.register(conn, &self.inner);
        st.conn = Some(conn);
        st.offer = Some(param.clone());
        st.state = IdState::Connecting;
        Ok(())
    }

    /// `rdma_accept`: answer the REQ this id was created for. With a QP it
    /// goes to RTR and RTS first; `Established` follows the RTU.
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        const VERB: &str = "rdma_accept";
        let mut st = self.inner.st.lock();
        if st.state != IdState::Requested {
            return Err(cm_err(VERB, "no connection request to accept"));
        }
        if param.private_data.len() > MAX_ACCEPT_PRIVATE_DATA {
            return Err(cm_err(VERB, "private data longer than 196 bytes"));
        }
        let ctx = st.ctx.clone().ok_or_else(|| cm_err(VERB, "no device"))?;
        let conn = st.conn.ok_or_else(|| cm_err(VERB, "no connection"))?;
        let now = ctx.soft("rdma_cm")?.now();
        if self.inner.ps.is_ud() {
            let qpn = st.qp.as_ref().map(Qp::qp_num).unwrap_or(param.qp_num);
            ctx.soft("rdma_cm")?.engine().cm().sidr_reply(
                conn,
                0,
                qpn,
                RDMA_UDP_QKEY,
                &param.private_data,
            )?;
            st.state = IdState::Connected;
            return Ok(());
        }
        let req = st
            .req
            .clone()
            .ok_or_else(|| cm_err(VERB, "no connection request"))?;
        if let Some(qp) = st.qp.clone() {
            let plan = passive_plan(
                &st,
                &ctx,
                &req,
                param.responder_resources,
                param.initiator_depth,
            )?;
            to_rts(&qp, &plan)?;
        }
        let qpn = st.qp.as_ref().map(Qp::qp_num).unwrap_or(param.qp_num);
        let rep: RepRepr = pcm::rep_for(&ConnParams {
            qpn,
            psn: st.psn,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            retry_count: param.retry_count,
            rnr_retry_count: param.rnr_retry_count,
            srq: false,
            private_data: param.private_data.clone(),
        })?;
        ctx.soft("rdma_cm")?.engine().cm().accept(now, conn, rep)?;
        st.state = IdState::Accepting;
        Ok(())
    }

    /// `rdma_reject` with `private_data` (at most 148 bytes); UDP ids
    /// answer the SIDR_REQ with status "rejected".
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        self.reject_inner(private_data, reason::CONSUMER_DEFINED)
    }

    fn reject_inner(&self, private_data: &[u8], reason: u16) -> Result<()> {
        const VERB: &str = "rdma_reject";
        let mut st = self.inner.st.lock();
        let ctx = st.ctx.clone().ok_or_else(|| cm_err(VERB, "no device"))?;
        let conn = st.conn.ok_or_else(|| cm_err(VERB, "no connection"))?;
        if self.inner.ps.is_ud() {
            ctx.soft("rdma_cm")?.engine().cm().sidr_reply(
                conn,
                pcm::SIDR_REJECT,
                0,
                0,
                private_data,
            )?;
        } else {
            ctx.soft("rdma_cm")?
                .engine()
                .cm()
                .reject_with_reason(conn, reason, private_data)?;
        }
        st.state = IdState::Rejected;
        Ok(())
    }

    /// `rdma_disconnect`: the QP goes to ERR (its WRs flush) and a DREQ
    /// (or, after the peer's, the DREP) is sent.
    pub fn disconnect(&self) -> Result<()> {
        const VERB: &str = "rdma_disconnect";
        let mut st = self.inner.st.lock();
        let ctx = st.ctx.clone().ok_or_else(|| cm_err(VERB, "no device"))?;
        let conn = st.conn.ok_or_else(|| cm_err(VERB, "not connected"))?;
        if let Some(qp) = &st.qp {
            qp_to_err(qp);
        }
        let now = ctx.soft("rdma_cm")?.now();
        ctx.soft("rdma_cm")?
            .engine()
            .cm()
            .disconnect(now, conn, &[])?;
        st.state = IdState::Disconnected;
        Ok(())
    }
}

impl Drop for IdInner {
    /// `rdma_destroy_id`: the CM forgets the connection or listener. The
    /// drop may run on the progress thread (the last reference can be an
    /// event sink's), which holds the device lock: the CM work is deferred.
    fn drop(&mut self) {
        let st = self.st.get_mut();
        let Some(ctx) = &st.ctx else {
            return;
        };
        let (conn, listen) = (st.conn, st.listen);
        if conn.is_none() && listen.is_none() {
            return;
        }
        let (Ok(router), Some(dev)) = (device_cm(ctx), ctx.soft_device()) else {
            return;
        };
        if let (Some(_), Some(local)) = (listen, st.local) {
            dev.release_service(rdma_cm::service_id(self.ps.code(), local.port()));
        }
        dev.defer(Box::new(move |e| {
            // Unregistered only once the CM has forgotten the IDs: no
            // later event can then park in the router's `early` buffer.
            if let Some(c) = conn {
                e.cm().destroy(c);
                router.unregister(c);
            }
            if let Some(l) = listen {
                e.cm().unlisten(l);
                router.unregister(l);
            }
        }));
    }
}

fn mtu_min(a: u8, b: u8) -> u8 {
    match (a, b) {
        (0, b) => b,
        (a, b) => a.min(b),
    }
}

fn mtu_of(code: u8) -> crate::Mtu {
    use crate::Mtu;
    match code {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

/// What a connected QP needs for RTR and RTS: from the REQ (passive) or
/// the REP (active), as the kernel's `cm_init_qp_rtr_attr`/`_rts_attr`.
///
/// PSNs as the kernel's rdma_cm sets them (and the golden captures show):
/// the starting PSN a side puts in its REQ or REP is the PSN *it* will
/// receive first (`rdma_init_qp_attr` sets `rq_psn = id_priv->seq_num`),
/// and each side sends from the PSN the other advertised.
struct QpPlan {
    peer: IpAddr,
    dest_qpn: u32,
    rq_psn: u32,
    sq_psn: u32,
    mtu: u8,
    max_dest_rd_atomic: u8,
    max_rd_atomic: u8,
    timeout: u8,
    retry: u8,
    rnr_retry: u8,
    traffic_class: u8,
    /// The REQ's primary flow label (the QP's GRH carries it).
    flow_label: u32,
}

/// The passive side's plan: the REQ, and what it grants in `accept`.
fn passive_plan(
    st: &IdState2,
    ctx: &Context,
    req: &ReqRepr,
    responder_resources: u8,
    initiator_depth: u8,
) -> Result<QpPlan> {
    Ok(QpPlan {
        peer: st.peer.map(|p| p.ip()).unwrap_or(ctx.addr()),
        dest_qpn: req.local_qpn,
        rq_psn: st.psn,
        sq_psn: req.starting_psn,
        mtu: mtu_min(req.path_mtu, ctx.query_port(1)?.active_mtu as u8),
        max_dest_rd_atomic: responder_resources.min(req.initiator_depth.max(1)),
        max_rd_atomic: initiator_depth.min(req.responder_resources.max(1)),
        timeout: req.primary.local_ack_timeout,
        retry: req.retry_count,
        rnr_retry: req.rnr_retry_count,
        traffic_class: st.tos,
        flow_label: req.primary.flow_label,
    })
}

/// The active side's plan: our offer and the REP.
fn active_plan(st: &IdState2, ctx: &Context, rep: &RepRepr) -> Result<QpPlan> {
    let offer = st.offer.clone().unwrap_or_default();
    Ok(QpPlan {
        peer: st.peer.map(|p| p.ip()).unwrap_or(ctx.addr()),
        dest_qpn: rep.local_qpn,
        rq_psn: st.psn,
        sq_psn: rep.starting_psn,
        mtu: ctx.query_port(1)?.active_mtu as u8,
        max_dest_rd_atomic: offer.responder_resources.min(rep.initiator_depth.max(1)),
        max_rd_atomic: offer.initiator_depth.min(rep.responder_resources.max(1)),
        timeout: st.ack_timeout,
        retry: offer.retry_count,
        rnr_retry: offer.rnr_retry_count,
        traffic_class: st.tos,
        flow_label: rdma_cm::roce_flow_label(
            st.local.map_or(0, |l| l.port()),
            st.peer.map_or(0, |p| p.port()),
        ),
    })
}

fn rtr_attr(p: &QpPlan) -> (QpAttr, AttrMask) {
    let mut access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    if p.max_dest_rd_atomic > 0 {
        access = access | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    }
    let mut av = av_to(p.peer);
    av.traffic_class = p.traffic_class;
    av.flow_label = p.flow_label;
    let a = QpAttr {
        qp_state: QpState::Rtr,
        qp_access_flags: access,
        path_mtu: mtu_of(p.mtu),
        dest_qp_num: p.dest_qpn,
        rq_psn: p.rq_psn & 0xff_ffff,
        max_dest_rd_atomic: p.max_dest_rd_atomic.max(1),
        // As the kernel's CM (`cm_init_qp_rtr_attr`): code 0, the longest
        // wait (655.36 ms), so a peer slow to post receives costs time,
        // not a connection (rnr_retry × 0.64 ms was 3 ms).
        min_rnr_timer: 0,
        av,
        ..QpAttr::default()
    };
    let mask = AttrMask::STATE
        | AttrMask::ACCESS_FLAGS
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    (a, mask)
}

fn rts_attr(p: &QpPlan) -> (QpAttr, AttrMask) {
    let a = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: p.sq_psn & 0xff_ffff,
        timeout: p.timeout,
        retry_cnt: p.retry & 7,
        rnr_retry: p.rnr_retry & 7,
        max_rd_atomic: p.max_rd_atomic.max(1),
        ..QpAttr::default()
    };
    let mask = AttrMask::STATE
        | AttrMask::SQ_PSN
        | AttrMask::TIMEOUT
        | AttrMask::RETRY_CNT
        | AttrMask::RNR_RETRY
        | AttrMask::MAX_QP_RD_ATOMIC;
    (a, mask)
}

/// INIT → RTR → RTS, as librdmacm does with `rdma_init_qp_attr`.
fn to_rts(qp: &Qp, plan: &QpPlan) -> Result<()> {
    let (a, m) = rtr_attr(plan);
    qp.modify(&a, m)?;
    let (a, m) = rts_attr(plan);
    qp.modify(&a, m)
}

/// The INIT attributes librdmacm gives a new QP (UD: with rdma_cm's Q_Key).
fn init_attr(ud: bool) -> (QpAttr, AttrMask) {
    let a = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qkey: RDMA_UDP_QKEY,
        qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        ..QpAttr::default()
    };
    let common = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
    if ud {
        (a, common | AttrMask::QKEY)
    } else {
        (a, common | AttrMask::ACCESS_FLAGS)
    }
}

fn ephemeral_port() -> u16 {
    // As the kernel's rdma_cm: a random port in the dynamic range.
    32768 + (random_u32() % 28232) as u16
}

/// The user's private data: a REQ's after rdma_cm's header.
fn user_data(data: &[u8], has_cma_header: bool) -> Vec<u8> {
    if has_cma_header {
        data.get(rdma_cm::CMA_HEADER_LEN..).unwrap_or(&[]).to_vec()
    } else {
        data.to_vec()
    }
}

/// Turn a queued event into what the user sees, doing librdmacm's part on
/// the way (QP transitions, RTU, new ids). `None`: nothing to report.
fn process(q: Queued) -> Result<Option<Event>> {
    let Queued { id, raw } = q;
    // The id was destroyed while its event waited: nothing to report.
    let Some(id) = id.upgrade() else {
        return Ok(None);
    };
    let ev = match raw {
        Raw::Local(kind) => Event {
            kind,
            id: CmId {
                inner: Arc::clone(&id),
            },
            listen_id: None,
            status: 0,
            param: ConnParam::default(),
            ud: None,
        },
        Raw::Cm(cm_ev) => return process_cm(id, cm_ev),
    };
    Ok(Some(ev))
}

/// The id a connection request creates on the listener's channel, on the
/// listener's device and address; None if the listener has no device.
fn passive_child(
    listener: &IdInner,
    peer: IpAddr,
    hdr: Option<rdma_cm::CmaHeader>,
    conn: ConnId,
) -> Option<Arc<IdInner>> {
    let (ctx, local) = {
        let st = listener.st.lock();
        (st.ctx.clone()?, st.local)
    };
    let mut st = IdState2::new(IdState::Requested);
    st.ctx = Some(ctx);
    st.local = local;
    st.peer = Some(SocketAddr::new(peer, hdr.map(|h| h.port).unwrap_or(0)));
    st.conn = Some(conn);
    Some(Arc::new(IdInner {
        channel: Mutex::new(Arc::clone(&listener.channel.lock())),
        ps: listener.ps,
        st: Mutex::new(st),
    }))
}

/// How to reach the device at `peer` (RoCEv2: by GID).
fn av_to(peer: IpAddr) -> AddressVector {
    AddressVector {
        dgid: gid(peer),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..AddressVector::default()
    }
}

/// librdmacm moves the QP to ERR (its WRs flush) on rdma_disconnect and
/// on REJECTED.
fn qp_to_err(qp: &Qp) {
    let _ = qp.modify(
        &QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        },
        AttrMask::STATE,
    );
}

fn event(id: &Arc<IdInner>, kind: EventKind) -> Event {
    Event {
        kind,
        id: CmId {
            inner: Arc::clone(id),
        },
        listen_id: None,
        status: 0,
        param: ConnParam::default(),
        ud: None,
    }
}

fn process_cm(id: Arc<IdInner>, ev: CmEvent) -> Result<Option<Event>> {
    match ev {
        CmEvent::ConnectRequest {
            conn, peer, req, ..
        } => {
            let hdr = rdma_cm::CmaHeader::parse(&req.private_data).ok();
            let Some(inner) = passive_child(&id, peer, hdr, conn) else {
                return Ok(None);
            };
            let child = CmId { inner };
            let Some(ctx) = child.context() else {
                return Ok(None);
            };
            {
                let mut st = child.inner.st.lock();
                st.ack_timeout = req.primary.local_ack_timeout;
                st.req = Some(req.clone());
            }
            device_cm(&ctx)?.register(conn, &child.inner);
            let mut e = event(&child.inner, EventKind::ConnectRequest);
            e.listen_id = Some(CmId { inner: id });
            e.param = ConnParam {
                private_data: user_data(&req.private_data, hdr.is_some()),
                responder_resources: req.responder_resources,
                initiator_depth: req.initiator_depth,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                qp_num: req.local_qpn,
                srq: req.srq,
            };
            Ok(Some(e))
        }
        CmEvent::SidrRequest {
            conn, peer, req, ..
        } => {
            let hdr = rdma_cm::CmaHeader::parse(&req.private_data).ok();
            let Some(child) = passive_child(&id, peer, hdr, conn) else {
                return Ok(None);
            };
            let mut e = event(&child, EventKind::ConnectRequest);
            e.listen_id = Some(CmId { inner: id });
            e.ud = Some(UdParam {
                qp_num: 0,
                qkey: RDMA_UDP_QKEY,
                ah_attr: av_to(peer),
                private_data: user_data(&req.private_data, hdr.is_some()),
            });
            e.param.private_data =
                e.ud.as_ref()
                    .map(|u| u.private_data.clone())
                    .unwrap_or_default();
            Ok(Some(e))
        }
        CmEvent::ConnectResponse { conn, rep } => {
            let mut st = id.st.lock();
            let Some(ctx) = st.ctx.clone() else {
                return Ok(None);
            };
            let param = ConnParam {
                private_data: rep.private_data.to_vec(),
                responder_resources: rep.responder_resources,
                initiator_depth: rep.initiator_depth,
                retry_count: 0,
                rnr_retry_count: rep.rnr_retry_count,
                qp_num: rep.local_qpn,
                srq: rep.srq,
            };
            st.rep = Some(rep.clone());
            let Some(qp) = st.qp.clone() else {
                drop(st);
                let mut e = event(&id, EventKind::ConnectResponse);
                e.param = param;
                return Ok(Some(e));
            };
            let moved = active_plan(&st, &ctx, &rep).and_then(|plan| to_rts(&qp, &plan));
            match moved {
                Ok(()) => {
                    // The RTU goes out; this is the id's Established (the
                    // CM's own, raised by `establish`, is swallowed below).
                    ctx.soft("rdma_cm")?.engine().cm().establish(conn, &[])?;
                    st.state = IdState::Connected;
                    st.established_reported = true;
                    drop(st);
                    Ok(Some(Event {
                        param,
                        ..event(&id, EventKind::Established)
                    }))
                }
                Err(_) => {
                    let _ = ctx.soft("rdma_cm")?.engine().cm().reject(conn, &[]);
                    st.state = IdState::Rejected;
                    drop(st);
                    Ok(Some(event(&id, EventKind::ConnectError)))
                }
            }
        }
        CmEvent::Established { .. } => {
            let mut st = id.st.lock();
            if std::mem::take(&mut st.established_reported) {
                // The active side already reported it with the REP.
                return Ok(None);
            }
            st.state = IdState::Connected;
            drop(st);
            Ok(Some(event(&id, EventKind::Established)))
        }
        CmEvent::Rejected {
            reason: r,
            private_data,
            ..
        } => {
            let mut st = id.st.lock();
            st.state = IdState::Rejected;
            // As librdmacm's rdma_get_cm_event: a rejected connection's
            // QP goes to ERR.
            if let Some(qp) = &st.qp {
                qp_to_err(qp);
            }
            drop(st);
            let mut e = event(&id, EventKind::Rejected);
            e.status = i32::from(r);
            e.param.private_data = private_data;
            Ok(Some(e))
        }
        CmEvent::Unreachable { .. } => {
            id.st.lock().state = IdState::Disconnected;
            let mut e = event(&id, EventKind::Unreachable);
            e.status = -110;
            Ok(Some(e))
        }
        // The QP keeps its state, as with librdmacm (only REJECTED moves
        // it to ERR there): the user's rdma_disconnect or destroy does.
        // Flushing here handed libfabric's rxm, closing the connection,
        // flushed completions the kernel's rdma_cm never produces.
        CmEvent::Disconnected { .. } => Ok(Some(event(&id, EventKind::Disconnected))),
        CmEvent::TimewaitExit { .. } => Ok(Some(event(&id, EventKind::TimewaitExit))),
        CmEvent::SidrResponse { rep, .. } => {
            let mut st = id.st.lock();
            let peer = st.peer.map(|p| p.ip());
            match rep {
                Some(rep) if rep.status == 0 => {
                    st.state = IdState::Connected;
                    drop(st);
                    let mut e = event(&id, EventKind::Established);
                    e.ud = Some(UdParam {
                        qp_num: rep.qpn,
                        qkey: rep.qkey,
                        ah_attr: av_to(peer.unwrap_or(IpAddr::from([0, 0, 0, 0]))),
                        private_data: rep.private_data.to_vec(),
                    });
                    Ok(Some(e))
                }
                Some(rep) => {
                    st.state = IdState::Rejected;
                    drop(st);
                    let mut e = event(&id, EventKind::Rejected);
                    e.status = i32::from(rep.status);
                    Ok(Some(e))
                }
                None => {
                    st.state = IdState::Disconnected;
                    drop(st);
                    let mut e = event(&id, EventKind::Unreachable);
                    e.status = -110;
                    Ok(Some(e))
                }
            }
        }
    }
}

/// The process's default device for rdma_cm (`ROXE_ADDR`'s first, else
/// the first free loopback address).
/// Whether binding loopback address `ip` takes the default device, as
/// the kernel's rdma_cm binds a loopback address to its first device
/// (`cma_bind_loopback`): when `ROXE_ADDR` names the devices and none of
/// them is on loopback (libfabric binds "localhost" to find the device it
/// may use). Otherwise an address is a device, and a loopback address
/// opens (or finds) the device there.
fn loopback_means_default(ip: IpAddr) -> Result<bool> {
    if !ip.is_loopback() {
        return Ok(false);
    }
    let listed = crate::soft_devices()?;
    let configured: Vec<IpAddr> = listed.iter().filter_map(|d| d.addr()).collect();
    Ok(!configured.is_empty()
        && configured.len() == listed.len()
        && configured.iter().all(|a| !a.is_loopback()))
}

/// When `ROXE_ADDR` names every device and none is at `ip`: the
/// addresses it names. Binding there then fails with ENODEV, as the
/// kernel's rdma_cm fails for an address whose interface has no RDMA
/// device (libfabric binds every address of the host to learn which
/// device serves it). `None`: `ip` is a device's, or devices take the
/// addresses they are bound to (`ROXE_ADDR` unset: an address is a
/// device).
fn configured_elsewhere(ip: IpAddr) -> Result<Option<String>> {
    let listed = crate::soft_devices()?;
    let configured: Vec<IpAddr> = listed.iter().filter_map(|d| d.addr()).collect();
    if configured.is_empty() || configured.len() != listed.len() || configured.contains(&ip) {
        return Ok(None);
    }
    let names: Vec<String> = configured.iter().map(IpAddr::to_string).collect();
    Ok(Some(names.join(",")))
}

fn default_context() -> Result<Context> {
    crate::soft_devices()?
        .into_iter()
        .next()
        .ok_or_else(|| verbs("rdma_bind_addr", Errno(19), "no roxe device"))?
        .open()
}
