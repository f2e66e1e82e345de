//! A soft device: one IP address, one UDP socket on port 4791, one engine
//! and one progress thread.
//!
//! Verbs calls lock the engine through [`Device::engine`]; when the guard
//! drops, everything the call made sendable leaves at once from the calling
//! thread (a doorbell without a thread hop), completion channels are
//! signalled, and the progress thread is woken only if the call created a
//! timer earlier than the one it sleeps towards. The progress thread
//! receives (in bursts, one lock per burst), fires timers and releases
//! packets the fault injector holds; it sleeps in `poll(2)` on the socket
//! and an eventfd, or spins with `busy_poll`. With `ROXE_ICRC=raw` (IPv4) it
//! receives from an `AF_PACKET` socket instead (`raw.rs`), passing each
//! packet's real IP and UDP headers to the engine, and discards what the
//! UDP socket receives (the same packets).

use super::batch::{RxBatch, TxBatch, TX_SLOT};
use super::channel::{ChannelShared, CompChannel};
use super::config::{DeviceConfig, IcrcMode};
use super::fault::{FaultStats, Faults};
use super::raw::{self, RawBatch, RawSkip};
use super::socket;
use super::tap::Tap;
use crate::engine::{CqId, Engine, EngineConfig, IcrcPolicy, Nanos, QpEvent, Stats, TxPass};
use crate::qp_attr::AddressVector;
use parking_lot::{Mutex, MutexGuard};
use rustix::event::{PollFd, PollFlags};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The RoCEv2 UDP port.
pub const ROCEV2_PORT: u16 = roxe_wire::ROCEV2_PORT;
/// Longest sleep of the progress thread (it re-checks `stop`).
const MAX_SLEEP: Duration = Duration::from_millis(100);
/// How often the progress thread runs the engine's liveness watchdog.
const AUDIT_EVERY: Nanos = 100_000_000;
/// A timer fired later than this after its deadline counts as late
/// (`DriverStats::timers_late`): more than one longest sleep plus
/// scheduling noise, so the progress thread missed a wake-up.
const LATE_TIMER: Nanos = 250_000_000;

/// How long a caller's empty `poll_cq` keeps the socket from the progress
/// thread (see [`CallerHold`]); the caller re-arms it every
/// [`HOLD_REARM_POLLS`] empty polls.
const CALLER_HOLD: Nanos = 100_000;
/// Empty polls between re-arms of the hold: far fewer than fit in
/// [`CALLER_HOLD`] (an empty poll is at least a `recvmmsg`, 0.2 µs or more),
/// so a spinning caller never lets it lapse, and its timer is reprogrammed
/// (a VM exit under a hypervisor) once every few tens of µs at most.
const HOLD_REARM_POLLS: u32 = 64;
/// A burst that ends this many messages or more makes the device a
/// stream's receiver (see [`CallerHold`]).
const STREAM_BURST: u32 = 8;

/// A receive burst of at least this many bytes, in packets of
/// [`RX_BULK_PACKET`] bytes or more on average, that ends two messages or
/// more or stops inside one, is bulk: the progress thread then coalesces
/// (`DeviceConfig::rx_coalesce_us`). Streams of small messages are not:
/// their senders wait on prompt ACKs (measured: `ib_send_bw -s 64 -q 4`
/// medians 1.11 -> 0.96 M msg/s when they coalesced); nor is one whole
/// message, as a ping-pong of large ones receives (its answer comes
/// during the sleep: 64 KiB `ib_write_lat` typical, medians of 8, 58 -> 76
/// µs before this rule).
const RX_BULK_BURST: usize = 32 * 1024;
const RX_BULK_PACKET: usize = 1024;
/// This many messages posted and not completed make the device a stream's
/// sender (see [`CallerHold`]).
const STREAM_SEND_QUEUE: usize = 16;

/// A CQ poll's pass is ACK-clocked as a single post's is (new messages wait
/// for the ACK on its way) while this many messages are posted and not
/// completed on the QPs in flight: a stream of single posts, whose polls
/// would otherwise send each message as its own small batch. Below, a
/// ping-pong's next message leaves at once.
const POLL_CLOCKED_QUEUE: usize = 8;

/// A caller that polled a CQ this recently (engine ns) is taken to be
/// spinning on it: the progress thread leaves it the messages held for
/// the ACK it just handled (see [`Shared::tx_for_caller`]).
const HANDOVER_RECENT: Nanos = 20_000;
/// How soon the progress thread sends what it left to a caller that did
/// not poll again.
const HANDOVER_FALLBACK: Duration = Duration::from_micros(50);

/// The socket left to callers spinning on `poll_cq` while a stream comes
/// in. A caller that polls an empty CQ receives itself
/// ([`Device::progress_here`]); the progress thread, asleep in `poll(2)` on
/// the socket as well, was still woken by every datagram, mostly to find
/// it taken, and on two vCPUs those wake-ups landed on the sender's CPU
/// (the kernel's wake-affine rule for a synchronous wake-up), preempting
/// the peer: `ib_send_bw -l 16` ran at 0.6-0.8 M msg/s in most runs and
/// 1.3 in the others. So while the device receives a stream (the last
/// burst ended [`STREAM_BURST`] messages or more) or sends one of small
/// messages by post lists ([`STREAM_SEND_QUEUE`] posted and not completed,
/// `Engine::sends_stream`), a caller's empty poll takes a hold: the
/// progress thread leaves the socket out of its sleep until the hold
/// expires, which a kernel timer (`timerfd`) signals, so a caller that
/// stops polling without notice leaves packets waiting at most
/// [`CALLER_HOLD`]. A ping-pong never holds, whatever its message size
/// (one message at a time): its caller takes a completion and may go to
/// spin on its buffer (`ib_write_lat`), and the progress thread must be
/// listening then. Arming a completion notification ends the hold at once
/// (the program is about to sleep on its channel), and so does a post
/// whose new message waits for an ACK (someone must receive that ACK now,
/// not at the program's next poll).
#[derive(Debug)]
struct CallerHold {
    /// A hold is on: the progress thread sleeps without the socket.
    on: AtomicBool,
    /// Empty polls since the timer was last armed.
    polls: AtomicU32,
    /// The device receives a stream (see [`STREAM_BURST`]).
    stream: AtomicBool,
    /// The device sends a stream (`Engine::sends_stream`, after each pass).
    sending: AtomicBool,
    /// Holds taken (from none), for `roxe stat`.
    taken: AtomicU64,
    /// Expires with the hold; always armed while `on` is set.
    timer: OwnedFd,
    /// `DeviceConfig::caller_hold` (and callers receive at all).
    enabled: bool,
}

impl CallerHold {
    fn new(enabled: bool) -> std::io::Result<Self> {
        let timer = rustix::time::timerfd_create(
            rustix::time::TimerfdClockId::Monotonic,
            rustix::time::TimerfdFlags::CLOEXEC | rustix::time::TimerfdFlags::NONBLOCK,
        )?;
        Ok(CallerHold {
            on: AtomicBool::new(false),
            polls: AtomicU32::new(0),
            stream: AtomicBool::new(false),
            sending: AtomicBool::new(false),
            taken: AtomicU64::new(0),
            timer,
            enabled,
        })
    }

    /// A caller polls an empty CQ: while a stream flows, hold the socket
    /// (the timer armed before `on` is set, so `on` never stands without
    /// one), or keep holding it.
    fn extend(&self) {
        if !self.enabled
            || !(self.stream.load(Ordering::Relaxed) || self.sending.load(Ordering::Relaxed))
        {
            return;
        }
        if self.on.load(Ordering::Acquire)
            && self.polls.fetch_add(1, Ordering::Relaxed) < HOLD_REARM_POLLS
        {
            return;
        }
        let spec = rustix::time::Itimerspec {
            it_interval: rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: CALLER_HOLD as _,
            },
        };
        let flags = rustix::time::TimerfdTimerFlags::empty();
        if rustix::time::timerfd_settime(&self.timer, flags, &spec).is_ok() {
            self.polls.store(0, Ordering::Relaxed);
            if !self.on.swap(true, Ordering::AcqRel) {
                self.taken.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The progress thread: the timer fired, the socket is its own again.
    fn expired(&self) {
        let _ = rustix::io::read(&self.timer, &mut [0u8; 8]);
        self.on.store(false, Ordering::Release);
    }
}

/// Driver-level counters (the engine's own are in [`Stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Datagrams handed to the kernel.
    pub tx_datagrams: u64,
    /// Datagrams the kernel refused (after waiting for buffer space).
    pub tx_errors: u64,
    /// Datagrams received.
    pub rx_datagrams: u64,
    /// Receive errors other than "nothing to read" (and truncated datagrams).
    pub rx_errors: u64,
    /// `sendmmsg` calls (each up to 64 datagrams).
    pub tx_batches: u64,
    /// UDP GSO sends among them (each several datagrams).
    pub tx_gso_sends: u64,
    /// 1 if the kernel refused UDP GSO and the device fell back to one
    /// datagram per message.
    pub tx_gso_refused: u64,
    /// `recvmmsg` calls that returned datagrams.
    pub rx_batches: u64,
    /// Those made in a caller's thread by a `poll_cq` that found nothing
    /// ([`Device::progress_here`]), not by the progress thread.
    pub rx_caller_batches: u64,
    /// `ROXE_ICRC=raw`: packets from the raw socket dropped before the
    /// engine because they are not a whole IPv4 UDP datagram to the device
    /// (a fragment, a bad IPv4 header checksum, inconsistent lengths). The
    /// engine counts the rest (`rx_bad_icrc`, `rx_malformed`, ...).
    pub rx_raw_dropped: u64,
    /// `ROXE_ICRC=raw`: datagrams the UDP socket received and the device
    /// discarded (copies of what the raw socket received).
    pub rx_udp_discarded: u64,
    /// Timers the progress thread fired more than 250 ms after their
    /// deadline: a missed wake-up (or a machine stalled that long).
    pub timers_late: u64,
    /// Times the progress thread woke from its sleep in `poll(2)` (socket,
    /// timer, eventfd or `roxe stat`): each is a cross-thread wake-up.
    pub progress_wakeups: u64,
    /// Holds callers took on the socket (see `CallerHold`): times a caller
    /// spinning on an empty CQ during a stream kept the socket from the
    /// progress thread.
    pub caller_holds: u64,
    /// Sleeps the progress thread took without the socket after a bulk
    /// receive burst (`DeviceConfig::rx_coalesce_us`).
    pub rx_coalesced: u64,
    /// Sleeps callers polling a CQ took before receiving, in a run of
    /// bulk bursts (the same interval).
    pub rx_caller_coalesced: u64,
    /// Passes of the progress thread that left the messages held for an
    /// ACK to a caller polling the CQ (see `HANDOVER_RECENT`).
    pub tx_left_to_caller: u64,
}

/// Everything a device counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// The transport's counters (drops by reason, retransmits, NAKs).
    pub engine: Stats,
    /// The socket's.
    pub driver: DriverStats,
    /// The fault injector's, when one is configured.
    pub faults: FaultStats,
}

/// The IPv4 identification packet `index` of a GRO datagram carried: a
/// Linux GSO sender's segment `index` (when its ICRC says so), else 0.
fn gro_ident(from: std::net::SocketAddr, own: IpAddr, p: &[u8], index: usize) -> u16 {
    let (Ok(k), IpAddr::V4(s), IpAddr::V4(d)) = (u16::try_from(index), from.ip(), own) else {
        return 0;
    };
    let Some(body) = p.len().checked_sub(roxe_wire::ICRC_LEN).map(|n| &p[..n]) else {
        return 0;
    };
    let matches = roxe_wire::icrc::compute_ipv4(s, d, from.port(), ROCEV2_PORT, k, body)
        .is_ok_and(|c| Ok(c) == roxe_wire::icrc::from_wire(p));
    if k > 0 && matches {
        k
    } else {
        0
    }
}

/// The device's LID on loopback: 127.0.x.y gives LID x·256 + y (a unicast
/// LID, 1..=0xBFFF), so LID-addressed programs (`is_global = 0`) can reach
/// roxe devices on one host. Other addresses have no LID (0).
pub fn lid_of(addr: IpAddr) -> u16 {
    match addr {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            let lid = u16::from_be_bytes([o[2], o[3]]);
            if o[0] == 127 && o[1] == 0 && (1..=0xBFFF).contains(&lid) {
                lid
            } else {
                0
            }
        }
        IpAddr::V6(_) => 0,
    }
}

/// The loopback device address a LID names (the inverse of [`lid_of`]).
pub fn addr_of_lid(lid: u16) -> Option<IpAddr> {
    (1..=0xBFFF).contains(&lid).then(|| {
        let [hi, lo] = lid.to_be_bytes();
        IpAddr::V4(Ipv4Addr::new(127, 0, hi, lo))
    })
}

pub(crate) struct Core {
    engine: Engine,
    /// Where a pass writes its first packet (before it takes
    /// `Shared::tx`), and where a packet goes through the fault injector
    /// (which may hold it).
    tx_buf: Vec<u8>,
    faults: Option<Faults>,
    tap: Option<Tap>,
    channels: Vec<(CqId, Arc<ChannelShared>)>,
    /// Who hears the engine's asynchronous events (`ibv_get_async_event`).
    event_sinks: Vec<Weak<EventSink>>,
    stats: DriverStats,
}

/// A receiver of a device's asynchronous QP events. It runs on the
/// progress thread under the device lock: it must be quick and must not
/// call back into the device.
pub type EventSink = dyn Fn(QpEvent) + Send + Sync;

/// Work for the engine that must not wait for the device lock where it is
/// created (see [`Device::defer`]).
pub type DeferredJob = Box<dyn FnOnce(&mut Engine) + Send>;

/// A receiver of the device's Communication Manager events. It runs under
/// the device lock (on the progress thread or a verb's thread): it must be
/// quick and must not call back into the device.
pub type CmEventSink = dyn Fn(crate::cm::CmEvent) + Send + Sync;

struct Shared {
    addr: IpAddr,
    /// Destinations the kernel routes to from `addr` ([`Device::check_route`]).
    routes: Mutex<std::collections::HashSet<IpAddr>>,
    socket: UdpSocket,
    /// The sockets packets leave from, one per UDP source port of
    /// `EngineConfig::src_ports` (same order): a pool bound to ephemeral
    /// ports, so QPs spread over source ports as on rxe and NICs; in
    /// shared mode, the device socket alone.
    send: Vec<UdpSocket>,
    /// Their UDP source ports, in the same order.
    send_ports: Vec<u16>,
    /// `ROXE_ICRC=raw` on an IPv4 device: the `AF_PACKET` socket packets
    /// are received from (see `raw.rs`).
    raw: Option<OwnedFd>,
    /// Shared-port mode (beside rxe): `socket` holds the claim port, where
    /// roxe devices on this host send their packets straight (the
    /// batch's `DirectPeers`); they are received from it, not discarded.
    direct_rx: bool,
    epoch: Instant,
    /// The wall clock (ns since the Unix epoch) at `epoch`: engine times
    /// as wall-clock times (`Device::wallclock_ns`).
    epoch_wall_ns: u64,
    core: Mutex<Core>,
    /// The packets of a pass, sent together. Taken under `core` (never
    /// the other way round) by a pass that has a packet to send, and held
    /// until the batch has left, which is after `core` is released: the
    /// next pass, and the verbs calls that send nothing (single posts held
    /// for an ACK, polls), need not wait for the system call. Batches
    /// leave in the order passes ran. Payloads sent by reference stay
    /// valid: a verb that may unregister memory first waits for the
    /// batch in flight ([`Shared::wait_for_batch`]), and no later batch
    /// refers to memory it removed.
    tx: Mutex<TxBatch>,
    /// When a caller last polled a CQ (`Device::engine_for_poll`,
    /// `Device::progress_here`), engine ns.
    caller_polled_at: AtomicU64,
    /// How recent that poll must be for the progress thread to leave it
    /// the held messages ([`HANDOVER_RECENT`]; tests lengthen it).
    handover_recent: AtomicU64,
    /// The progress thread handled an ACK while a caller was polling and
    /// left the messages held for it (new messages of a stream of single
    /// posts, `Engine::has_held`) to that caller: its next poll's pass
    /// sends them, unclocked. perftest's `ib_write_bw` polls a completion
    /// per 64 KiB WRITE; the ACK's pass sending 8 or more of them held the
    /// device lock 430 µs on average while its caller waited for the lock
    /// to poll and post (three threads on two vCPUs), now the caller, who
    /// spins anyway, sends them. If it does not poll again within
    /// [`HANDOVER_FALLBACK`], the progress thread sends them.
    tx_for_caller: AtomicBool,
    wake: OwnedFd,
    /// The deadline the progress thread sleeps towards (`u64::MAX`: none;
    /// 0: it is awake and will look at the timers before sleeping again).
    /// Written and compared under the core lock.
    sleeping_until: AtomicU64,
    stop: AtomicBool,
    /// Work to run under the core lock at the next pass ([`Device::defer`]).
    deferred: Mutex<Vec<DeferredJob>>,
    /// Jobs wait in `deferred`: every verb and pass checks this flag, and
    /// takes the lock only when it is set (the data path never does).
    has_deferred: AtomicBool,
    /// Who hears the CM's events (rdma_cm ids). Its own lock (taken inside
    /// the core lock, never around it), so subscribing never waits for the
    /// engine.
    cm_sinks: Mutex<Vec<Weak<CmEventSink>>>,
    busy_poll: bool,
    /// The receive pool. Whoever receives holds it from `recvmmsg` until
    /// the burst is handled, so packets reach the engine in the order the
    /// socket gave them even when a caller's thread and the progress
    /// thread take turns.
    rx: Mutex<RxBatch>,
    /// Callers of `poll_cq` receive themselves ([`Device::progress_here`]).
    caller_progress: bool,
    /// The socket left to a caller spinning on `poll_cq` (see
    /// [`CallerHold`]).
    hold: CallerHold,
    /// `DeviceConfig::rx_coalesce_us`, in nanoseconds (0: off).
    rx_coalesce_ns: u64,
    /// When (device clock) the last of two or more bulk bursts in a row
    /// was received, by any thread; 0: the last burst was not bulk, or
    /// the first. A caller's receive then waits for the end of the
    /// coalescing interval ([`Device::progress_here`]). One message split
    /// over two bursts (a 64 KiB ping-pong's, received by a spinning
    /// caller as it comes) makes no run: `ib_send_lat -s 65536` took 131
    /// µs instead of 65 when a single bulk burst was enough.
    rx_bulk_at: AtomicU64,
    /// Bulk bursts in a row.
    rx_bulk_run: AtomicU32,
    /// Sleeps callers took before receiving (`rx_bulk_at`).
    rx_caller_coalesced: AtomicU64,
    /// The last receive burst held 32 KiB or more (see `rx_coalesce_ns`);
    /// cleared by the progress thread as it starts a coalescing sleep, and
    /// by a caller arming a notification.
    rx_bulk: AtomicBool,
    /// The progress thread is in (or about to start) a coalescing sleep.
    rx_coalescing: AtomicBool,
    /// ACK-clocked sends after verbs (`DeviceConfig::ack_clocked`).
    ack_clocked: bool,
    /// Large payloads sent by reference (`DeviceConfig::payload_by_ref`).
    payload_by_ref: bool,
    /// Tests: the progress thread does nothing while set
    /// ([`Device::pause_progress_thread`]).
    progress_paused: AtomicBool,
    /// The progress thread has seen `progress_paused` and does nothing.
    progress_parked: AtomicBool,
    /// `roxe stat`'s socket (None where it could not be made).
    stat: Option<super::stat::StatServer>,
}

/// An open soft device. Dropping it stops its progress thread.
pub struct Device {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("addr", &self.shared.addr)
            .finish_non_exhaustive()
    }
}

/// Exclusive access to the device's engine; on drop, whatever the caller
/// made sendable is sent and completion channels are signalled.
///
/// The lock is released fairly (handed to a waiting thread, if any): a
/// program spinning on `poll_cq` would otherwise re-take it at once and
/// starve the progress thread until parking_lot's forced fairness, about
/// half a millisecond later, which measured as 0.5 ms per round trip.
pub struct EngineGuard<'a> {
    core: Option<MutexGuard<'a, Core>>,
    shared: &'a Shared,
    /// What the guard was taken for (after a single post, the pass is
    /// ACK-clocked where the device is: [`Device::engine_for_post`]).
    post: Post,
}

/// What an [`EngineGuard`] was taken for: a send post tells whether the
/// program sends a stream its callers should receive for (see
/// [`CallerHold`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Post {
    /// Any verb but a send post.
    Other,
    /// One send WR ([`Device::engine_for_post`]).
    Single,
    /// A list of send WRs ([`Device::engine_for_post_list`]).
    List,
    /// A CQ poll.
    Poll,
}

impl std::ops::Deref for EngineGuard<'_> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        match &self.core {
            Some(c) => &c.engine,
            None => unreachable!("the guard is only emptied in drop"),
        }
    }
}

impl std::ops::DerefMut for EngineGuard<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        match &mut self.core {
            Some(c) => &mut c.engine,
            None => unreachable!("the guard is only emptied in drop"),
        }
    }
}

impl Drop for EngineGuard<'_> {
    fn drop(&mut self) {
        if let Some(mut core) = self.core.take() {
            // A poll the progress thread left the held messages to sends
            // them (`Shared::tx_for_caller`).
            let left_here =
                self.post == Post::Poll && self.shared.tx_for_caller.swap(false, Ordering::AcqRel);
            let ack_clocked = self.shared.ack_clocked
                && !left_here
                && match self.post {
                    Post::Single => true,
                    Post::Poll => core.engine.queued_at_least(POLL_CLOCKED_QUEUE),
                    Post::Other | Post::List => false,
                };
            let batch = self.shared.after_work(&mut core, ack_clocked);
            // A stream of single posts is ACK-clocked: the progress thread
            // receives the ACK that sends what waits (measured: holding the
            // socket for the caller then slowed `ib_send_bw -s 64` by 12 %).
            // A stream of post lists goes without ACKs' help: its callers
            // receive (`ib_send_bw -s 64 -l 16` 0.65 -> 1.1 M msg/s).
            let held = ack_clocked && core.engine.has_held();
            let hold = &self.shared.hold;
            match self.post {
                Post::Other | Post::Poll => {}
                Post::Single => hold.sending.store(false, Ordering::Relaxed),
                Post::List => hold.sending.store(
                    core.engine.sends_stream(STREAM_SEND_QUEUE),
                    Ordering::Relaxed,
                ),
            }
            MutexGuard::unlock_fair(core);
            self.shared.send_batch(batch);
            // A message held for an ACK needs someone receiving now, not at
            // the program's next poll.
            if held && hold.on.load(Ordering::Acquire) {
                self.shared.end_hold();
            }
        }
    }
}

/// The batch lock, held ([`Device::hold_batch`]).
pub struct BatchHold<'a>(#[allow(dead_code)] MutexGuard<'a, TxBatch>);

/// The UDP port a device sends from, and holds as its claim on its
/// address, where port 4791 belongs to the kernel's rxe (see [`Shared4791`]).
pub const SHARED_MODE_PORT: u16 = 47910;

/// Sockets a device sends from (each on its own ephemeral UDP port): the
/// source ports its QPs spread over.
const SEND_SOCKETS: usize = 8;

/// How a device owns its address: its own socket on port 4791, or, where
/// the kernel's rxe holds `0.0.0.0:4791`, a claim on [`SHARED_MODE_PORT`]
/// (which it sends from) and a raw socket that receives what is addressed
/// to port 4791 of its address. RoCEv2 fixes only the destination port.
/// rxe sees the same packets on its socket and ignores those for
/// interfaces it is not attached to (loopback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shared4791 {
    /// Port 4791 of the address is free for a socket of ours.
    No,
    /// `0.0.0.0:4791` (or `[::]:4791`) is held: share it.
    Yes,
}

/// Whether a wildcard socket holds port 4791 (the kernel's rxe does from
/// `rdma link add`), read from `/proc/net/udp{,6}`.
fn wildcard_4791_held(v6: bool) -> bool {
    let (file, wildcard) = if v6 {
        ("/proc/net/udp6", "00000000000000000000000000000000:12B7")
    } else {
        ("/proc/net/udp", "00000000:12B7")
    };
    std::fs::read_to_string(file).is_ok_and(|t| {
        t.lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(1) == Some(wildcard))
    })
}

/// Bind `addr`'s socket: port 4791, or in shared mode the claim port.
fn bind_device(addr: IpAddr) -> io::Result<(UdpSocket, Shared4791)> {
    match socket::bind(addr, ROCEV2_PORT) {
        Ok(s) => Ok((s, Shared4791::No)),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse && wildcard_4791_held(addr.is_ipv6()) => {
            let s = socket::bind(addr, SHARED_MODE_PORT).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "port 4791 is held by another socket on every address (the kernel's \
                         rxe); sharing it, {} is taken: {e}",
                        SocketAddr::new(addr, SHARED_MODE_PORT)
                    ),
                )
            })?;
            Ok((s, Shared4791::Yes))
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("binding {}: {e}", SocketAddr::new(addr, ROCEV2_PORT)),
        )),
    }
}

/// The address a device without a configured one would take if opened
/// now (`ibv_devices` shows its GUID before any open): the first
/// 127.0.0.N whose port 4791 (or, beside rxe, whose claim port) no socket
/// holds, per `/proc/net/udp`.
pub fn next_auto_addr() -> Option<IpAddr> {
    let table = std::fs::read_to_string("/proc/net/udp").ok()?;
    let port = if wildcard_4791_held(false) {
        SHARED_MODE_PORT
    } else {
        ROCEV2_PORT
    };
    let bound: std::collections::HashSet<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
        .collect();
    (1..=0xBFFFu16).filter_map(addr_of_lid).find(|a| {
        let IpAddr::V4(v4) = a else { return false };
        let key = format!("{:08X}:{port:04X}", u32::from_le_bytes(v4.octets()));
        !bound.contains(&key)
    })
}

/// Bind the first free loopback address from 127.0.0.1 upward.
fn bind_auto() -> io::Result<(IpAddr, UdpSocket, Shared4791)> {
    for lid in 1..=0xBFFFu16 {
        let Some(addr) = addr_of_lid(lid) else {
            continue;
        };
        match bind_device(addr) {
            Ok((s, shared)) => return Ok((addr, s, shared)),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "every loopback address 127.0.0.1 .. 127.0.191.255 has port 4791 taken",
    ))
}

/// The one line that explains a shared-mode device without CAP_NET_RAW.
fn shared_mode_needs_raw(addr: IpAddr, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!(
            "{addr}: port 4791 is held by the kernel's rxe (0.0.0.0:4791); roxe shares it by \
             receiving from a raw socket, which needs CAP_NET_RAW: run as root, or \
             `setcap cap_net_raw+ep` the program, or remove the rxe link (`rdma link delete`)"
        ),
    )
}

impl Device {
    /// Open a device: bind its socket, start its progress thread.
    pub fn open(config: &DeviceConfig) -> io::Result<Device> {
        crate::logging::init_from_env();
        let (addr, socket, shared) = match config.addr {
            Some(a) => {
                let (s, shared) = bind_device(a)?;
                (a, s, shared)
            }
            None => bind_auto()?,
        };
        let raw = match (config.icrc, addr, shared) {
            (_, IpAddr::V4(v4), Shared4791::Yes) => {
                Some(raw::open(v4, ROCEV2_PORT).map_err(|e| shared_mode_needs_raw(addr, e))?)
            }
            (_, IpAddr::V6(_), Shared4791::Yes) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{addr}: port 4791 is held by the kernel's rxe ([::]:4791); sharing \
                         it is built for IPv4 device addresses only"
                    ),
                ))
            }
            // Never a silent fallback: without CAP_NET_RAW this fails.
            (IcrcMode::Raw, IpAddr::V4(v4), _) => Some(raw::open(v4, ROCEV2_PORT)?),
            // IPv6: the UDP socket already shows every field the ICRC covers.
            _ => None,
        };
        if shared == Shared4791::Yes {
            tracing::info!(%addr, port = SHARED_MODE_PORT, "port 4791 held by the kernel's rxe: sharing it");
        }
        let gso = config.gso;
        let gro = gso && socket::enable_gro(&socket).is_ok();
        let mut ec = EngineConfig::new(addr);
        ec.active_mtu = super::netdev::active_mtu(addr);
        ec.icrc_policy = match (config.icrc, raw.is_some()) {
            (IcrcMode::Off, _) => IcrcPolicy::Off,
            // A raw socket shows the wire's headers: the exact check.
            (_, true) => IcrcPolicy::WireHeaders,
            (IcrcMode::Warn, false) => IcrcPolicy::Warn,
            (IcrcMode::Strict | IcrcMode::Raw, false) => IcrcPolicy::AssumeLinuxSender,
        };
        // The ICRC covers the UDP source port: each packet's socket's own.
        // Beside rxe (raw receive) everything leaves from the claim port,
        // as before; otherwise from a pool of sockets on ephemeral ports.
        let send: Vec<UdpSocket> = match shared {
            Shared4791::Yes => vec![socket.try_clone()?],
            Shared4791::No => (0..SEND_SOCKETS)
                .map(|_| socket::bind(addr, 0))
                .collect::<io::Result<_>>()?,
        };
        ec.src_ports = send
            .iter()
            .map(|s| s.local_addr().map(|a| a.port()))
            .collect::<io::Result<_>>()?;
        // Peers on this host that receive through raw sockets too (beside
        // rxe) drop bursts of 1,024 (`tools/tests/shared_port.rs`). Roxe
        // peers beside rxe, reached at their claim port through a UDP
        // socket, get the wide window once the batch finds them
        // (`Engine::set_udp_peer`, in `after_work`).
        ec.wide_loopback_window = raw.is_none();
        // As wide as the peers' receive buffers allow (ours tells: the
        // same limits apply on this host).
        let rcvbuf = socket::recv_buffer(&socket)?;
        ec.loopback_window = socket::loopback_window(rcvbuf);
        if ec.loopback_window < crate::engine::MAX_LOOPBACK_WINDOW {
            tracing::info!(
                %addr,
                rcvbuf,
                window = ec.loopback_window,
                "small socket receive buffer: the window towards loopback peers is narrowed \
                 (raise net.core.rmem_max to 8 MiB, or run with CAP_NET_ADMIN, for the full one)"
            );
        }
        // Peers on this host that read through raw sockets (beside rxe, or
        // `ROXE_ICRC=raw` like this device) see a GSO send uncut.
        let gso_loopback = shared == Shared4791::No && config.icrc != IcrcMode::Raw;
        let tap = match &config.pcap {
            Some(p) => Some(Tap::create(p)?),
            None => None,
        };
        let wake = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        // Raw receive (beside rxe, or ROXE_ICRC=raw) and busy polling stay
        // with the progress thread.
        let caller_progress = config.caller_progress && raw.is_none() && !config.busy_poll;
        let hold = CallerHold::new(caller_progress && config.caller_hold)?;
        let epoch = Instant::now();
        let epoch_wall_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let shared = Arc::new(Shared {
            addr,
            routes: Mutex::new(Default::default()),
            socket,
            send,
            send_ports: ec.src_ports.clone(),
            raw,
            direct_rx: shared == Shared4791::Yes,
            epoch,
            epoch_wall_ns,
            tx: Mutex::new({
                let mut tx = TxBatch::new(ROCEV2_PORT, gso);
                // Beside rxe the peers on this host receive through raw
                // sockets, which see a GSO send uncut: none to them,
                // except to shared-mode roxe peers reached at their
                // claim port (a UDP socket with GRO).
                tx.set_source(addr, gso_loopback);
                if shared == Shared4791::Yes {
                    tx.set_direct(super::batch::DirectPeers::new(SHARED_MODE_PORT));
                }
                tx
            }),
            core: Mutex::new(Core {
                engine: Engine::new(ec),
                tx_buf: vec![0; TX_SLOT],
                faults: config.fault.map(Faults::new),
                tap,
                channels: Vec::new(),
                event_sinks: Vec::new(),
                stats: DriverStats::default(),
            }),
            wake,
            sleeping_until: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            deferred: Mutex::new(Vec::new()),
            has_deferred: AtomicBool::new(false),
            cm_sinks: Mutex::new(Vec::new()),
            busy_poll: config.busy_poll,
            rx: Mutex::new(RxBatch::new(gro)),
            caller_progress,
            hold,
            rx_coalesce_ns: u64::from(config.rx_coalesce_us) * 1000,
            rx_bulk_at: AtomicU64::new(0),
            caller_polled_at: AtomicU64::new(0),
            handover_recent: AtomicU64::new(HANDOVER_RECENT),
            tx_for_caller: AtomicBool::new(false),
            rx_bulk_run: AtomicU32::new(0),
            rx_caller_coalesced: AtomicU64::new(0),
            rx_bulk: AtomicBool::new(false),
            rx_coalescing: AtomicBool::new(false),
            ack_clocked: config.ack_clocked,
            payload_by_ref: config.payload_by_ref,
            progress_paused: AtomicBool::new(false),
            progress_parked: AtomicBool::new(false),
            stat: match super::stat::StatServer::open(addr) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::debug!(%addr, error = %e, "no roxe stat socket");
                    None
                }
            },
        });
        tracing::info!(%addr, gso, icrc = ?config.icrc, "device open");
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("roxe-progress {addr}"))
            .spawn(move || s.progress())?;
        Ok(Device {
            shared,
            thread: Some(thread),
        })
    }

    /// Progress in the caller's thread, for a `poll_cq` that found nothing:
    /// receive one burst from the socket and handle it (completions, ACKs,
    /// replies), unless another thread is receiving. True if packets were
    /// handled. A completion then needs no hand-over from the progress
    /// thread. That thread still sleeps on the socket too: callers may stop
    /// polling at any moment without saying so (perftest's `ib_write_lat`
    /// spins on its buffer between polls), and taking the socket from it
    /// while callers spin (tried: 200 µs windows, ended early when a caller
    /// took completions) raised 64 B SEND rates by about 15 % but gave
    /// `ib_write_lat` millisecond tails (mean 66-355 µs instead of 28-38).
    /// Does nothing where the progress thread must receive (raw receive,
    /// `busy_poll`) or with `caller_progress` off.
    pub fn progress_here(&self) -> bool {
        let s = &*self.shared;
        let now = s.now();
        s.caller_polled_at.store(now, Ordering::Relaxed);
        if !s.caller_progress {
            return false;
        }
        s.hold.extend();
        // Coalescing, as the progress thread does after a bulk burst (see
        // `rx_bulk_at`): a caller spinning on the CQ of a bulk stream sleeps
        // out the rest of the interval, leaving the core to the peer's
        // sender on a small machine, and then takes a larger burst.
        // `roxe perf read -s 65536` (its requester polls): 3.07 -> 3.34 GB/s
        // medians of 8 alternated pairs; `-e` (sleeping on the channel)
        // measured 3.6 against 3.0 polling before.
        let bulk_at = s.rx_bulk_at.load(Ordering::Relaxed);
        if bulk_at > 0 {
            let until = bulk_at.saturating_add(s.rx_coalesce_ns);
            if now < until {
                std::thread::sleep(Duration::from_nanos(until - now));
                s.rx_caller_coalesced.fetch_add(1, Ordering::Relaxed);
            }
        }
        let Some(mut rx) = s.rx.try_lock() else {
            return false;
        };
        let mut guard = None;
        s.receive_udp(&mut rx, &mut guard);
        drop(rx);
        match guard {
            Some(mut core) => {
                core.stats.rx_caller_batches += 1;
                let batch = s.after_work(&mut core, false);
                MutexGuard::unlock_fair(core);
                s.send_batch(batch);
                true
            }
            None => false,
        }
    }

    /// For tests: how recently a caller must have polled for the progress
    /// thread to leave it the messages held for an ACK (`HANDOVER_RECENT`).
    #[doc(hidden)]
    pub fn set_handover_recent(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.shared.handover_recent.store(ns, Ordering::Relaxed);
    }

    /// For tests: take the batch lock as a pass sending a batch holds it
    /// (see `Shared::tx`), until the returned guard drops.
    #[doc(hidden)]
    pub fn hold_batch(&self) -> BatchHold<'_> {
        BatchHold(self.shared.tx.lock())
    }

    /// The program is about to sleep (a completion notification was
    /// armed): the progress thread takes the socket back now.
    pub fn caller_sleeps(&self) {
        let s = &*self.shared;
        // A coalescing sleep (`DeviceConfig::rx_coalesce_us`) would delay
        // the event the caller waits for: end it, and start none (see the
        // progress loop for the ordering).
        s.rx_bulk.store(false, Ordering::SeqCst);
        if s.rx_coalescing.load(Ordering::SeqCst) {
            s.wake();
        }
        s.end_hold();
    }

    /// For tests: whether a caller holds the socket now (see `CallerHold`).
    #[doc(hidden)]
    pub fn caller_hold_on(&self) -> bool {
        self.shared.hold.on.load(Ordering::Acquire)
    }

    /// For tests: stop the progress thread from receiving, firing timers
    /// or sending (`true`) or let it go on (`false`), so that what still
    /// works is what callers' threads do themselves.
    /// Pausing returns once the thread has finished what it was doing
    /// (within 10 s), so nothing it receives afterwards is handled.
    #[doc(hidden)]
    pub fn pause_progress_thread(&self, paused: bool) {
        let s = &*self.shared;
        // Set again by the thread each time it looks while paused.
        s.progress_parked.store(false, Ordering::Release);
        s.progress_paused.store(paused, Ordering::Release);
        s.wake();
        let t0 = std::time::Instant::now();
        while paused
            && !s.progress_parked.load(Ordering::Acquire)
            && t0.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// An engine time of this device (a completion's, from
    /// `Engine::poll_cq_at`) as wall-clock nanoseconds since the Unix
    /// epoch: monotonic (the engine's clock is `Instant`-based), anchored to
    /// the wall clock once, when the device opened.
    pub fn wallclock_ns(&self, at: Nanos) -> u64 {
        self.shared.epoch_wall_ns.saturating_add(at)
    }

    /// The device's address.
    pub fn addr(&self) -> IpAddr {
        self.shared.addr
    }

    /// The device's RoCEv2 GID (GID index 0).
    pub fn gid(&self) -> [u8; 16] {
        crate::engine::gid_of(self.shared.addr)
    }

    /// The device's LID (0 unless it is on 127.0.0.0/16).
    pub fn lid(&self) -> u16 {
        lid_of(self.shared.addr)
    }

    /// Nanoseconds since the device opened (the engine's clock).
    pub fn now(&self) -> Nanos {
        self.shared.now()
    }

    /// Write what the capture (`ROXE_PCAP`) holds to its file: for
    /// devices that are never closed (the drop-in librdmacm's, flushed when
    /// the process exits).
    pub fn flush_capture(&self) {
        if let Some(tap) = self.shared.core.lock().tap.as_mut() {
            tap.flush_pending();
        }
    }

    /// Lock the engine for a verbs call.
    pub fn engine(&self) -> EngineGuard<'_> {
        self.guard(Post::Other)
    }

    /// [`engine`](Self::engine) for polling a CQ.
    pub fn engine_for_poll(&self) -> EngineGuard<'_> {
        let s = &*self.shared;
        s.caller_polled_at.store(s.now(), Ordering::Relaxed);
        self.guard(Post::Poll)
    }

    /// [`engine`](Self::engine) for posting a list of send WRs.
    pub fn engine_for_post_list(&self) -> EngineGuard<'_> {
        self.guard(Post::List)
    }

    /// [`engine`](Self::engine) for posting one send WR (`ibv_post_send`
    /// without a list): the pass after it is ACK-clocked
    /// (`DeviceConfig::ack_clocked`): a reliable QP's new message waits
    /// while 16 or more PSNs of the device are unacknowledged (with
    /// several QPs in flight, only a single-packet message), and the pass
    /// the coming ACK starts sends it with the others posted meanwhile. A post
    /// list is its own batch and goes at once ([`engine`](Self::engine)):
    /// holding lists back halved 64 KiB WRITEs over 1,024 QPs (each QP was
    /// left one message in flight).
    pub fn engine_for_post(&self) -> EngineGuard<'_> {
        self.guard(Post::Single)
    }

    fn guard(&self, post: Post) -> EngineGuard<'_> {
        let mut core = self.shared.core.lock();
        // A verb that may unregister memory (any but posts and polls)
        // waits for the batch in flight (see `Shared::tx`).
        if post == Post::Other {
            self.shared.wait_for_batch();
        }
        // Work deferred by earlier calls happens before this one: a verb
        // sees what the drops before it did (a listener destroyed just
        // before another listens on its port has released it).
        self.shared.run_deferred(&mut core);
        EngineGuard {
            core: Some(core),
            shared: &self.shared,
            post,
        }
    }

    /// Resolve an address vector to the destination device address: its
    /// GID, or for an LID-only AV (`is_global = 0`) on a loopback device,
    /// the loopback device with that LID. Returns the AV the engine takes
    /// (with the GID filled in) or `None` if it names no destination.
    pub fn resolve_av(&self, av: &AddressVector) -> Option<AddressVector> {
        if av.is_global {
            return Some(*av);
        }
        if self.lid() == 0 {
            // Real RoCE semantics: without a GRH there is no destination.
            return None;
        }
        let dst = addr_of_lid(av.dlid)?;
        Some(AddressVector {
            dgid: crate::engine::gid_of(dst),
            is_global: true,
            sgid_index: 0,
            hop_limit: if av.hop_limit == 0 { 64 } else { av.hop_limit },
            ..*av
        })
    }

    /// Whether the kernel routes from this device's address to the
    /// destination of `av`, as rxe finds out when a QP is given its path
    /// (`ENETUNREACH` and the like when not; routes found are
    /// remembered). What `modify_qp` checks before RTR.
    pub fn check_route(&self, av: &AddressVector) -> Result<(), crate::types::VerbsError> {
        let dst = crate::engine::addr_of_gid(av.dgid);
        if self.shared.routes.lock().contains(&dst) {
            return Ok(());
        }
        match super::netdev::route_error(self.shared.addr, dst) {
            None => {
                self.shared.routes.lock().insert(dst);
                Ok(())
            }
            Some(e) => Err(crate::types::VerbsError::new(
                "ibv_modify_qp",
                crate::types::Errno(e.raw_os_error().unwrap_or(libc::ENETUNREACH)),
                format!("no route from {} to {dst}: {e}", self.shared.addr),
            )),
        }
    }

    /// Deliver events of `cq` to `channel` (after `request_notify`).
    pub fn attach_channel(&self, cq: CqId, channel: &CompChannel) {
        let mut core = self.shared.core.lock();
        core.channels.retain(|(c, _)| *c != cq);
        core.channels.push((cq, channel.shared()));
    }

    /// Deliver the device's asynchronous QP events to `sink` for as long as
    /// the caller keeps it alive.
    pub fn subscribe_events(&self, sink: &Arc<EventSink>) {
        self.shared
            .core
            .lock()
            .event_sinks
            .push(Arc::downgrade(sink));
    }

    /// Deliver the device's CM events to `sink` for as long as the caller
    /// keeps it alive. Events with no sink are dropped.
    pub fn subscribe_cm_events(&self, sink: &Arc<CmEventSink>) {
        self.shared.cm_sinks.lock().push(Arc::downgrade(sink));
    }

    /// Run `job` on the engine at the next pass of the progress thread (or
    /// of any verb), under the device lock. For work that may be started
    /// where that lock is already held (a drop inside an event sink): it
    /// never waits for the lock itself.
    pub fn defer(&self, job: DeferredJob) {
        self.shared.deferred.lock().push(job);
        self.shared.has_deferred.store(true, Ordering::Release);
        self.shared.wake();
    }

    /// Stop delivering events of `cq`.
    pub fn detach_channel(&self, cq: CqId) {
        self.shared.core.lock().channels.retain(|(c, _)| *c != cq);
    }

    /// Counters.
    pub fn stats(&self) -> DeviceStats {
        let core = self.shared.core.lock();
        let tx = self.shared.tx.lock().counters;
        DeviceStats {
            engine: core.engine.stats(),
            driver: DriverStats {
                tx_datagrams: tx.datagrams,
                tx_errors: tx.errors,
                tx_batches: tx.syscalls,
                tx_gso_sends: tx.gso_sends,
                tx_gso_refused: tx.gso_refused,
                caller_holds: self.shared.hold.taken.load(Ordering::Relaxed),
                rx_caller_coalesced: self.shared.rx_caller_coalesced.load(Ordering::Relaxed),
                ..core.stats
            },
            faults: core.faults.as_ref().map(Faults::stats).unwrap_or_default(),
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(tap) = self.shared.core.lock().tap.as_mut() {
            tap.flush();
        }
    }
}

impl Shared {
    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// End a caller's hold on the socket now (see [`CallerHold`]).
    fn end_hold(&self) {
        if self.hold.on.swap(false, Ordering::AcqRel) {
            self.wake();
        }
    }

    fn wake(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// Send what the engine has, signal channels, and make sure the
    /// progress thread wakes for the earliest timer. Runs under the lock.
    /// The answer to `roxe stat` (see `stat.rs`): the device's counters,
    /// then one line per QP.
    fn stat_answer(&self, core: &Core) -> String {
        /// `reason:count,...` of the non-zero drop counters, `-` if none.
        fn drops_field(d: &crate::engine::DropCounts) -> String {
            let v: Vec<String> = d.nonzero().map(|(r, n)| format!("{r}:{n}")).collect();
            if v.is_empty() {
                "-".into()
            } else {
                v.join(",")
            }
        }
        use std::fmt::Write as _;
        let e = core.engine.stats();
        let d = &core.stats;
        let tx = self.tx.lock().counters;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "device pid={} addr={} rx_packets={} tx_packets={} tx_retransmits={} timeouts={} \
             naks_sent={} rnr_naks_received={} rx_malformed={} rx_bad_icrc={} rx_no_qp={} \
             rx_wrong_peer={} rx_dropped={} rx_datagrams={} tx_datagrams={} tx_errors={} \
             timers_late={} tx_batches={} tx_gso_sends={} rx_batches={} rx_caller_batches={} \
             progress_wakeups={} caller_holds={} rx_coalesced={} rx_caller_coalesced={} \
             tx_left_to_caller={} drops={}",
            std::process::id(),
            self.addr,
            e.rx_packets,
            e.tx_packets,
            e.tx_retransmits,
            e.timeouts,
            e.naks_sent,
            e.rnr_naks_received,
            e.rx_malformed,
            e.rx_bad_icrc,
            e.rx_no_qp,
            e.rx_wrong_peer,
            e.rx_dropped,
            d.rx_datagrams,
            tx.datagrams,
            tx.errors,
            d.timers_late,
            tx.syscalls,
            tx.gso_sends,
            d.rx_batches,
            d.rx_caller_batches,
            d.progress_wakeups,
            self.hold.taken.load(Ordering::Relaxed),
            d.rx_coalesced,
            self.rx_caller_coalesced.load(Ordering::Relaxed),
            d.tx_left_to_caller,
            drops_field(&e.drops),
        );
        for q in core.engine.qp_snapshots() {
            let (peer, dest_qpn) = match q.peer {
                Some((a, n)) => (a.to_string(), n.to_string()),
                None => ("-".into(), "-".into()),
            };
            let _ = writeln!(
                out,
                "qp qpn={} type={} state={} peer={peer} dest_qpn={dest_qpn} next_psn={} \
                 una={} epsn={} send_queue={} recv_queue={} retry_left={} rnr_retry_left={} \
                 rx_packets={} tx_packets={} tx_retransmits={} timeouts={} naks_sent={} \
                 rnr_naks_received={} drops={}",
                q.qpn,
                format!("{:?}", q.qp_type).to_uppercase(),
                format!("{:?}", q.state).to_uppercase(),
                q.next_psn,
                q.una,
                q.epsn,
                q.send_queue,
                q.recv_queue,
                q.retry_left,
                q.rnr_retry_left,
                q.counters.rx_packets,
                q.counters.tx_packets,
                q.counters.tx_retransmits,
                q.counters.timeouts,
                q.counters.naks_sent,
                q.counters.rnr_naks_received,
                drops_field(&q.drops),
            );
        }
        for c in core.engine.cq_snapshots() {
            let _ = writeln!(
                out,
                "cq id={} depth={} waiting={} overflowed={} qps={}",
                c.id.0, c.depth, c.waiting, c.overflowed, c.qps
            );
        }
        let cm = core.engine.cm_stats();
        let refused: Vec<String> = cm
            .refused
            .nonzero()
            .map(|(r, n)| format!("{r}:{n}"))
            .collect();
        let _ = writeln!(
            out,
            "cm rx_mads={} tx_mads={} tx_retries={} malformed={} unmatched={} no_listener={} \
             backlog_full={} stale_req={} refused={}",
            cm.rx_mads,
            cm.tx_mads,
            cm.tx_retries,
            cm.rx_malformed,
            cm.rx_unmatched,
            cm.rejected_no_listener,
            cm.dropped_backlog_full,
            cm.rx_stale_req,
            if refused.is_empty() {
                "-".to_string()
            } else {
                refused.join(",")
            },
        );
        out
    }

    fn run_deferred(&self, core: &mut Core) {
        if !self.has_deferred.swap(false, Ordering::AcqRel) {
            return;
        }
        let jobs = std::mem::take(&mut *self.deferred.lock());
        // Deferred verbs (destroys from drops) may unregister memory.
        self.wait_for_batch();
        for job in jobs {
            job(&mut core.engine);
        }
    }

    /// Wait until the batch being sent (if any) has left: for a verb that
    /// may unregister memory a batch refers to by reference.
    fn wait_for_batch(&self) {
        drop(self.tx.lock());
    }

    /// Send the batch `after_work` returned, after the device lock is
    /// released.
    fn send_batch(&self, tx: Option<MutexGuard<'_, TxBatch>>) {
        if let Some(mut tx) = tx {
            if !tx.is_empty() {
                tx.flush(&self.send[..]);
            }
        }
    }

    /// Run deferred work, then a transmit pass and the notifications, under
    /// the device lock (`core`). Returns the batch of packets the pass made
    /// (locked), to be sent with [`send_batch`](Self::send_batch) once the
    /// device lock is released.
    #[must_use]
    fn after_work(&self, core: &mut Core, ack_clocked: bool) -> Option<MutexGuard<'_, TxBatch>> {
        self.run_deferred(core);
        let now = self.now();
        let Core {
            engine,
            tx_buf,
            faults,
            tap,
            channels,
            event_sinks,
            ..
        } = core;
        let mut txg: Option<MutexGuard<'_, TxBatch>> = None;
        let socks = &self.send[..];
        // Which socket sends from a packet's source port (the engine took
        // it from this pool, in this order).
        let ports = &self.send_ports;
        let sock_of = |sport: u16| ports.iter().position(|&p| p == sport).unwrap_or(0) as u8;
        match faults.as_mut() {
            None => loop {
                // Large payloads leave straight from registered memory:
                // see `Shared::tx` for why they stay valid until sent.
                let pass = TxPass {
                    ack_clocked,
                    payload_by_ref: self.payload_by_ref,
                };
                let (t, p) = match txg.as_mut() {
                    // The engine writes straight into the batch.
                    Some(tx) => {
                        if tx.is_full() {
                            tx.flush(socks);
                        }
                        let Some(t) = engine.poll_transmit_pass(now, tx.slot(), pass) else {
                            break;
                        };
                        (t, tx.commit(t.len, t.dst, sock_of(t.src_port), t.payload))
                    }
                    // The first packet: the batch is taken only if there
                    // is one (a pass that sends nothing does not wait for
                    // the batch another thread is sending).
                    None => {
                        let Some(t) = engine.poll_transmit_pass(now, tx_buf, pass) else {
                            break;
                        };
                        let tx = txg.insert(self.tx.lock());
                        let sock = sock_of(t.src_port);
                        (t, tx.commit_copy(tx_buf, t.len, t.dst, sock, t.payload))
                    }
                };
                if let Some(tap) = tap.as_mut() {
                    match t.payload {
                        None => tap.write(self.addr, t.src_port, t.dst, ROCEV2_PORT, p),
                        Some(pl) => {
                            let (head, tail) = p.split_at(pl.at);
                            // SAFETY: the engine took the payload from its
                            // memory table in this call, and the table has
                            // not changed since (the engine is locked here).
                            let data = unsafe { pl.data.bytes() };
                            let whole = [head, data, tail].concat();
                            tap.write(self.addr, t.src_port, t.dst, ROCEV2_PORT, &whole);
                        }
                    }
                }
            },
            Some(f) => {
                // Each packet through the injector, one at a time; what it
                // lets through (now or later) joins the batch.
                let tx = txg.insert(self.tx.lock());
                let mut emit = |p: &[u8], dst: IpAddr, sport: u16| {
                    if let Some(t) = tap.as_mut() {
                        t.write(self.addr, sport, dst, ROCEV2_PORT, p);
                    }
                    tx.push(socks, p, dst, sock_of(sport));
                };
                f.release_due(now, &mut emit);
                while let Some(t) = engine.poll_transmit(now, tx_buf) {
                    f.submit(now, &mut tx_buf[..t.len], t.dst, t.src_port, &mut emit);
                }
            }
        }
        // Roxe peers beside rxe reached at their claim port receive through
        // a UDP socket: the wide window is safe towards them (in-guest
        // `ib_write_bw -s 65536`: 88 -> 105 MB/s medians). Found by the
        // flushes of earlier batches.
        if let Some(tx) = txg.as_mut() {
            for (peer, direct) in tx.take_direct_changes() {
                engine.set_udp_peer(peer, direct);
            }
        }
        // A stream sent ends when its messages are done.
        if self.hold.sending.load(Ordering::Relaxed) && !engine.sends_stream(STREAM_SEND_QUEUE) {
            self.hold.sending.store(false, Ordering::Relaxed);
        }
        for (cq, ch) in channels.iter() {
            if engine.cq_mut(*cq).map(|c| c.take_events()).unwrap_or(0) > 0 {
                ch.notify(*cq);
            }
        }
        if engine.cm().has_events() {
            let sinks: Vec<Arc<CmEventSink>> = {
                let mut all = self.cm_sinks.lock();
                all.retain(|s| s.strong_count() > 0);
                all.iter().filter_map(Weak::upgrade).collect()
            };
            while let Some(ev) = engine.cm().poll_event() {
                for sink in &sinks {
                    sink(ev.clone());
                }
            }
        }
        if engine.has_events() {
            event_sinks.retain(|s| s.strong_count() > 0);
            for ev in engine.take_events() {
                for sink in event_sinks.iter().filter_map(Weak::upgrade) {
                    sink(ev);
                }
            }
        }
        let deadline = earliest(
            engine.poll_timeout(),
            faults.as_ref().and_then(Faults::next_release),
        );
        if let Some(d) = deadline {
            if d < self.sleeping_until.load(Ordering::Acquire) {
                self.sleeping_until.store(0, Ordering::Release);
                self.wake();
            }
        }
        txg
    }

    /// Receive one burst from the UDP socket and hand it to the engine under
    /// the lock (taken into `guard`). True if the burst was full (more may
    /// be queued).
    fn receive_udp<'a>(
        &'a self,
        rx: &mut RxBatch,
        guard: &mut Option<MutexGuard<'a, Core>>,
    ) -> bool {
        self.receive_udp_with(rx, guard, Engine::handle_segment)
    }

    /// [`receive_udp`](Self::receive_udp), each packet handed to `handle`.
    fn receive_udp_with<'a>(
        &'a self,
        rx: &mut RxBatch,
        guard: &mut Option<MutexGuard<'a, Core>>,
        handle: fn(&mut Engine, Nanos, IpAddr, u16, &[u8], usize),
    ) -> bool {
        // Receive without the lock, then handle the burst under it with one
        // clock read.
        let n = match rx.recv(&self.socket) {
            Ok(0) => return false,
            Ok(n) => n,
            Err(_) => {
                guard
                    .get_or_insert_with(|| self.core.lock())
                    .stats
                    .rx_errors += 1;
                return false;
            }
        };
        let core = guard.get_or_insert_with(|| self.core.lock());
        let now = self.now();
        core.stats.rx_batches += 1;
        let mut messages = 0u32;
        let (mut bytes, mut packets) = (0usize, 0usize);
        let mut last_ends = false;
        for k in 0..n {
            let (from, d, seg) = rx.get(k);
            bytes += d.len();
            let Some(from) = from else {
                core.stats.rx_errors += 1;
                continue;
            };
            // GRO: equal packets (the last may be shorter) as one.
            for (i, p) in d
                .chunks(if seg == 0 { d.len().max(1) } else { seg })
                .enumerate()
            {
                core.stats.rx_datagrams += 1;
                packets += 1;
                if let Some(t) = core.tap.as_mut() {
                    let ident = gro_ident(from, self.addr, p, i);
                    t.write_ident(from.ip(), from.port(), self.addr, ROCEV2_PORT, ident, p);
                }
                last_ends = ends_message(p);
                messages += u32::from(last_ends);
                handle(&mut core.engine, now, from.ip(), from.port(), p, i);
            }
        }
        self.hold
            .stream
            .store(messages >= STREAM_BURST, Ordering::Relaxed);
        let bulk = bytes >= RX_BULK_BURST
            && bytes >= packets * RX_BULK_PACKET
            && (messages >= 2 || !last_ends);
        self.rx_bulk.store(bulk, Ordering::Relaxed);
        let run = if bulk {
            self.rx_bulk_run.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.rx_bulk_run.store(0, Ordering::Relaxed);
            0
        };
        self.rx_bulk_at
            .store(if run >= 2 { now.max(1) } else { 0 }, Ordering::Relaxed);
        n == super::batch::MAX_BATCH
    }

    /// `ROXE_ICRC=raw`: discard what the UDP socket received, then receive
    /// one burst from the raw socket and hand each packet with its headers
    /// to the engine under the lock. True if the burst was full. Beside
    /// rxe the UDP socket (the claim port) receives what roxe devices on
    /// this host send straight to it: that is handled, a burst per call.
    fn receive_raw<'a>(
        &'a self,
        raw_fd: &OwnedFd,
        rb: &mut RawBatch,
        drain: &mut RxBatch,
        guard: &mut Option<MutexGuard<'a, Core>>,
    ) -> bool {
        let IpAddr::V4(own) = self.addr else {
            unreachable!("a raw socket is opened for IPv4 devices only")
        };
        let mut full = false;
        if self.direct_rx {
            full = self.receive_udp_with(drain, guard, Engine::handle_direct_segment);
        }
        // The UDP socket gets a copy of every packet: a few bursts at most
        // per call (the rest next time round).
        let mut discarded = 0u64;
        for _ in 0..if self.direct_rx { 0 } else { 4 } {
            let Ok(n) = drain.recv(&self.socket) else {
                break;
            };
            for k in 0..n {
                let (_, d, seg) = drain.get(k);
                discarded += if seg == 0 {
                    1
                } else {
                    d.len().div_ceil(seg) as u64
                };
            }
            if n < super::batch::MAX_BATCH {
                break;
            }
        }
        if discarded > 0 {
            guard
                .get_or_insert_with(|| self.core.lock())
                .stats
                .rx_udp_discarded += discarded;
        }
        let n = match rb.recv(raw_fd) {
            Ok(0) => return full,
            Ok(n) => n,
            Err(_) => {
                guard
                    .get_or_insert_with(|| self.core.lock())
                    .stats
                    .rx_errors += 1;
                return full;
            }
        };
        let core = guard.get_or_insert_with(|| self.core.lock());
        let now = self.now();
        core.stats.rx_batches += 1;
        for k in 0..n {
            let p = match rb.get(k) {
                Ok(p) => p,
                Err(RawSkip::Truncated) => {
                    core.stats.rx_errors += 1;
                    continue;
                }
                // The device's own transmission, not a packet to it.
                Err(RawSkip::Outgoing) => continue,
            };
            let Some((ip, udp, payload)) = raw::split(p, own, ROCEV2_PORT) else {
                core.stats.rx_raw_dropped += 1;
                continue;
            };
            core.stats.rx_datagrams += 1;
            if let Some(t) = core.tap.as_mut() {
                let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
                let sport = u16::from_be_bytes([udp[0], udp[1]]);
                t.write(IpAddr::V4(src), sport, self.addr, ROCEV2_PORT, payload);
            }
            core.engine.handle_ip_packet(now, ip, udp, payload);
        }
        full || n == super::batch::MAX_BATCH
    }

    fn progress(self: Arc<Self>) {
        let mut raw_rx = self.raw.as_ref().map(|fd| (fd, RawBatch::new()));
        let mut next_audit: Nanos = 0;
        let mut stat_pending = false;
        // Counted here, added to the stats under the next lock.
        let mut wakeups = 0u64;
        let mut coalesced = 0u64;
        while !self.stop.load(Ordering::Acquire) {
            if self.progress_paused.load(Ordering::Acquire) {
                self.progress_parked.store(true, Ordering::Release);
                let mut fds = [PollFd::new(&self.wake, PollFlags::IN)];
                let pause = rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: 1_000_000,
                };
                let _ = rustix::event::poll(&mut fds, Some(&pause));
                let _ = rustix::io::read(&self.wake, &mut [0u8; 8]);
                continue;
            }
            let mut guard: Option<MutexGuard<'_, Core>> = None;
            // A caller holding the socket receives (see `CallerHold`).
            while !self.hold.on.load(Ordering::Acquire) {
                // Held from receive to hand-over (see `Shared::rx`).
                let mut rx = self.rx.lock();
                let full = match raw_rx.as_mut() {
                    None => self.receive_udp(&mut rx, &mut guard),
                    Some((fd, rb)) => self.receive_raw(fd, rb, &mut rx, &mut guard),
                };
                drop(rx);
                if !full {
                    // Drained for now: timers, sends and sleep below.
                    break;
                }
                // A full burst: send what it produced and let verbs calls in.
                if let Some(mut g) = guard.take() {
                    let batch = self.after_work(&mut g, false);
                    MutexGuard::unlock_fair(g);
                    self.send_batch(batch);
                }
            }
            let mut core = guard.unwrap_or_else(|| self.core.lock());
            core.stats.progress_wakeups += std::mem::take(&mut wakeups);
            core.stats.rx_coalesced += std::mem::take(&mut coalesced);
            let now = self.now();
            if core
                .engine
                .poll_timeout()
                .is_some_and(|d| now > d + LATE_TIMER)
            {
                core.stats.timers_late += 1;
            }
            core.engine.handle_timeout(now);
            if now >= next_audit {
                // The watchdog for "a QP waits forever": see
                // `Engine::audit_liveness` (debug builds check after every call).
                core.engine.audit_liveness(now);
                next_audit = now + AUDIT_EVERY;
                // Busy-polling devices never sleep in poll: answer here.
                stat_pending |= self.busy_poll;
            }
            if std::mem::take(&mut stat_pending) {
                if let Some(st) = &self.stat {
                    st.serve(|| self.stat_answer(&core));
                }
            }
            // A caller spinning on the CQ takes the completions this pass
            // made and sends what was held for them (`tx_for_caller`): the
            // pass is ACK-clocked, as its poll's would be.
            let polled = self.caller_polled_at.load(Ordering::Relaxed);
            let recent = self.handover_recent.load(Ordering::Relaxed);
            let handover =
                self.ack_clocked && core.engine.has_held() && now.saturating_sub(polled) < recent;
            let batch = self.after_work(&mut core, handover);
            let left = handover && core.engine.has_held();
            if left {
                core.stats.tx_left_to_caller += 1;
            }
            self.tx_for_caller.store(left, Ordering::Release);
            let deadline = earliest(
                core.engine.poll_timeout(),
                core.faults.as_ref().and_then(Faults::next_release),
            );
            if self.busy_poll {
                MutexGuard::unlock_fair(core);
                self.send_batch(batch);
                std::hint::spin_loop();
                continue;
            }
            // Going idle: what the capture holds reaches the file, so it is
            // complete even if the process exits without closing the device
            // (librdmacm keeps its devices open until exit).
            if let Some(tap) = core.tap.as_mut() {
                tap.flush_pending();
            }
            self.sleeping_until
                .store(deadline.unwrap_or(u64::MAX), Ordering::Release);
            MutexGuard::unlock_fair(core);
            self.send_batch(batch);
            let until_deadline = deadline
                .map(|d| Duration::from_nanos(d.saturating_sub(self.now())))
                .unwrap_or(Duration::MAX);
            let stat_fd = self.stat.as_ref().map(|s| s.fd());
            let stat_or_wake = stat_fd.unwrap_or(self.wake.as_fd());
            // While a caller holds the socket, its datagrams do not wake
            // this thread; the hold's timer does when it expires.
            let held = self.hold.on.load(Ordering::Acquire);
            // After a bulk burst, a short sleep without the socket: the
            // next burst is larger and the sender's datagrams meanwhile
            // wake nobody (see `DeviceConfig::rx_coalesce_us`).
            // `rx_coalescing` is set before `rx_bulk` is taken, and a
            // caller arming a notification clears `rx_bulk` before it
            // reads `rx_coalescing` (all SeqCst): either this thread sees
            // the cleared flag, or the caller sees this one and wakes it.
            let coalescing = self.rx_coalesce_ns > 0
                && !held
                && until_deadline > Duration::from_nanos(self.rx_coalesce_ns)
                && {
                    self.rx_coalescing.store(true, Ordering::SeqCst);
                    let bulk = self.rx_bulk.swap(false, Ordering::SeqCst);
                    if !bulk {
                        self.rx_coalescing.store(false, Ordering::Relaxed);
                    }
                    bulk
                };
            let sleep = if coalescing {
                coalesced += 1;
                Duration::from_nanos(self.rx_coalesce_ns)
            } else {
                until_deadline.min(MAX_SLEEP)
            };
            let sleep = if left {
                sleep.min(HANDOVER_FALLBACK)
            } else {
                sleep
            };
            let ts = rustix::time::Timespec {
                tv_sec: sleep.as_secs() as _,
                tv_nsec: sleep.subsec_nanos() as _,
            };
            let socket_or_wake = if held || coalescing {
                self.wake.as_fd()
            } else {
                self.socket.as_fd()
            };
            let mut fds = [
                PollFd::new(&socket_or_wake, PollFlags::IN),
                PollFd::new(&self.wake, PollFlags::IN),
                PollFd::new(self.raw.as_ref().unwrap_or(&self.wake), PollFlags::IN),
                PollFd::new(&stat_or_wake, PollFlags::IN),
                PollFd::new(&self.hold.timer, PollFlags::IN),
            ];
            let _ = rustix::event::poll(&mut fds, Some(&ts));
            self.rx_coalescing.store(false, Ordering::Relaxed);
            wakeups += 1;
            stat_pending = stat_fd.is_some() && !fds[3].revents().is_empty();
            if !fds[4].revents().is_empty() {
                self.hold.expired();
            }
            let mut drain = [0u8; 8];
            let _ = rustix::io::read(&self.wake, &mut drain);
            self.sleeping_until.store(0, Ordering::Release);
        }
    }
}

/// Whether a packet (from its BTH on) ends a message: the last or only
/// packet of a SEND, WRITE or READ response.
fn ends_message(p: &[u8]) -> bool {
    use roxe_wire::opcode::{Opcode, PacketClass};
    p.first()
        .and_then(|&b| Opcode::try_from(b).ok())
        .is_some_and(|o| matches!(o.class(), PacketClass::Last | PacketClass::Only))
}

fn earliest(a: Option<Nanos>, b: Option<Nanos>) -> Option<Nanos> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lids_map_loopback_addresses_both_ways() {
        for (a, lid) in [
            ("127.0.0.1", 1),
            ("127.0.1.0", 256),
            ("127.0.191.255", 0xBFFF),
        ] {
            let a: IpAddr = a.parse().unwrap();
            assert_eq!(lid_of(a), lid);
            assert_eq!(addr_of_lid(lid), Some(a));
        }
        for a in ["127.0.192.0", "127.1.0.1", "10.0.0.1", "::1", "127.0.0.0"] {
            assert_eq!(lid_of(a.parse().unwrap()), 0, "{a}");
        }
        assert_eq!(addr_of_lid(0), None);
        assert_eq!(addr_of_lid(0xC000), None);
    }
}
