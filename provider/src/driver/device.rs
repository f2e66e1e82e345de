//! A soft device: one IP address, one UDP socket on port 4791, one engine
//! and one progress thread.
//!
//! # The threads and the calling order
//!
//! A device is used from two kinds of threads at once: the program's,
//! through the verbs (every call takes the device lock through one of the
//! `engine*` methods), and its progress thread (`progress.rs`). The
//! contract:
//!
//! 1. A verb takes the lock with the method named for it:
//!    [`engine_for_post`](Device::engine_for_post) for one send WR,
//!    [`engine_for_post_list`](Device::engine_for_post_list) for a list,
//!    [`engine_for_poll`](Device::engine_for_poll) for a CQ poll,
//!    [`engine`](Device::engine) for anything else. The kind decides how
//!    the pass after it is paced (`pacing.rs`), and a verb that may
//!    unregister memory (`engine`) first waits for the batch in flight.
//! 2. When the [`EngineGuard`] drops, the pass runs: everything the verb
//!    made sendable leaves from the calling thread (a doorbell without a
//!    thread hop), completion channels are signalled, and the progress
//!    thread is woken only if the verb created a timer earlier than the
//!    one it sleeps towards.
//! 3. A poll that found nothing calls [`progress_here`](Device::progress_here):
//!    it receives one burst itself, in the caller's thread.
//! 4. A program about to sleep on a completion channel calls
//!    [`caller_sleeps`](Device::caller_sleeps) once it has armed the
//!    notification: the progress thread then receives for it.
//! 5. Work that must not wait for the lock where it starts (a drop inside
//!    an event sink) goes through [`defer`](Device::defer).
//!
//! The progress thread receives in bursts (one lock per burst), fires
//! timers and releases packets the fault injector holds; it sleeps in
//! `poll(2)` on the socket and an eventfd, or spins with `busy_poll`. With
//! `ROXE_ICRC=raw` (IPv4), and beside the kernel's rxe, it receives from an
//! `AF_PACKET` socket instead (`raw.rs`).
//!
//! Every decision about when to send, receive or sleep is the [`Pacer`]'s;
//! this file opens the device and carries those decisions out.

use super::batch::{RxBatch, TxBatch, TX_SLOT};
use super::bind::{
    bind_auto, bind_device, shared_mode_needs_raw, wildcard_4791_held, AddressClaim, SEND_SOCKETS,
};
use super::channel::CompChannel;
use super::config::{DeviceConfig, IcrcMode};
use super::counters::{DeviceStats, DriverStats};
use super::fault::Faults;
use super::guard::EngineGuard;
use super::lid::{addr_of_lid, lid_of};
use super::pacing::{CallerReceive, Pacer, PacingConfig, Verb};
use super::shared::{CmEventSink, Core, DeferredJob, EventSink, Shared};
use super::steering::SharedAddress;
use super::tap::Tap;
use super::{raw, socket, SHARED_MODE_PORT};
use crate::engine::{CqId, Engine, EngineConfig, IcrcPolicy, Nanos};
use crate::qp_attr::AddressVector;
use parking_lot::{Mutex, MutexGuard};
use std::io;
use std::net::{IpAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// The RoCEv2 UDP port.
pub const ROCEV2_PORT: u16 = roxe_wire::ROCEV2_PORT;

/// An open soft device. Dropping it stops its progress thread.
pub struct Device {
    pub(super) shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// On a shared address: the thread that probes the group again when
    /// packets of other processes arrive here.
    steering_thread: Option<JoinHandle<()>>,
    /// The process that opened it.
    pid: u32,
}

/// Close `socket` now, though others hold its `Shared` (completion
/// channels): a fresh unbound socket takes its descriptor, so that the
/// address's reuseport group renumbers while the registry is locked.
fn close_socket(socket: &UdpSocket) {
    use std::os::fd::AsRawFd;
    let Ok(blank) = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None) else {
        return;
    };
    // SAFETY: both descriptors are open and owned by live objects;
    // dup2 atomically makes `socket`'s descriptor refer to the blank
    // socket (closing the bound one), and `blank` keeps its own.
    unsafe {
        libc::dup2(blank.as_raw_fd(), socket.as_raw_fd());
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("addr", &self.shared.addr)
            .finish_non_exhaustive()
    }
}

impl Device {
    /// Open a device: bind its socket, start its progress thread.
    pub fn open(config: &DeviceConfig) -> io::Result<Device> {
        crate::logging::init_from_env();
        let shareable = |a: IpAddr| {
            !config.exclusive && config.icrc != IcrcMode::Raw && !wildcard_4791_held(a.is_ipv6())
        };
        let (addr, socket, claim, steering) = match config.addr {
            Some(a) if shareable(a) => {
                let (st, s, nudged) = SharedAddress::join(a, ROCEV2_PORT)?;
                (a, s, AddressClaim::Port4791, Some((st, nudged)))
            }
            Some(a) => {
                let (s, claim) = bind_device(a)?;
                (a, s, claim, None)
            }
            None => {
                let (a, s, claim) = bind_auto()?;
                (a, s, claim, None)
            }
        };
        let (steering, nudged) = steering.unzip();
        let raw = match (config.icrc, addr, claim) {
            (_, IpAddr::V4(v4), AddressClaim::ClaimPort) => {
                Some(raw::open(v4, ROCEV2_PORT).map_err(|e| shared_mode_needs_raw(addr, e))?)
            }
            (_, IpAddr::V6(_), AddressClaim::ClaimPort) => {
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
        let beside_rxe = claim == AddressClaim::ClaimPort;
        if beside_rxe {
            tracing::info!(%addr, port = SHARED_MODE_PORT, "port 4791 held by the kernel's rxe: sharing it");
        }
        let gso = config.pacing.gso;
        let gro = gso && socket::enable_gro(&socket).is_ok();
        let mut ec = EngineConfig::new(addr);
        ec.qpn_slot = steering.as_ref().map_or(0, |s| s.slot());
        ec.active_mtu = super::netdev::active_mtu(addr);
        ec.icrc_policy = match (config.icrc, raw.is_some()) {
            (IcrcMode::Off, _) => IcrcPolicy::Off,
            // A raw socket shows the wire's headers: the exact check.
            (_, true) => IcrcPolicy::WireHeaders,
            (IcrcMode::Warn, false) => IcrcPolicy::Warn,
            (IcrcMode::Strict | IcrcMode::Raw, false) => IcrcPolicy::AssumeLinuxSender,
        };
        // The ICRC covers the UDP source port: each packet's socket's own.
        // Beside rxe (raw receive) everything leaves from the claim port;
        // otherwise from a pool of sockets on ephemeral ports.
        let send: Vec<UdpSocket> = if beside_rxe {
            vec![socket.try_clone()?]
        } else {
            (0..SEND_SOCKETS)
                .map(|_| socket::bind(addr, 0))
                .collect::<io::Result<_>>()?
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
        ec.keep_early = !config.go_back_n_only;
        ec.hold_acks = config.pacing.ack_hold;
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
        let gso_loopback = !beside_rxe && config.icrc != IcrcMode::Raw;
        let tap = match &config.pcap {
            Some(p) => Some(Tap::create(p)?),
            None => None,
        };
        let wake = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        let hold_timer = rustix::time::timerfd_create(
            rustix::time::TimerfdClockId::Monotonic,
            rustix::time::TimerfdFlags::CLOEXEC | rustix::time::TimerfdFlags::NONBLOCK,
        )?;
        // Raw receive (beside rxe, or ROXE_ICRC=raw) and busy polling stay
        // with the progress thread.
        let caller_progress =
            config.pacing.caller_progress && raw.is_none() && !config.pacing.busy_poll;
        let pacing = PacingConfig {
            caller_progress,
            caller_hold: caller_progress && config.pacing.caller_hold,
            ..config.pacing
        };
        let epoch = Instant::now();
        let epoch_wall_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let shared = Arc::new(Shared {
            addr,
            routes: Mutex::new(Default::default()),
            socket,
            steering,
            send,
            send_ports: ec.src_ports.clone(),
            raw,
            direct_rx: beside_rxe,
            epoch,
            epoch_wall_ns,
            tx: Mutex::new({
                let mut tx = TxBatch::new(ROCEV2_PORT, gso);
                // Beside rxe the peers on this host receive through raw
                // sockets, which see a GSO send uncut: none to them,
                // except to shared-mode roxe peers reached at their
                // claim port (a UDP socket with GRO).
                tx.set_source(addr, gso_loopback);
                if beside_rxe {
                    tx.set_direct(super::batch::DirectPeers::new(SHARED_MODE_PORT));
                }
                tx
            }),
            core: Mutex::new(Core {
                engine: Engine::new(ec),
                tx_buf: vec![0; TX_SLOT],
                faults: config.fault.map(|f| Faults::new(f, addr)),
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
            rx: Mutex::new(RxBatch::new(gro)),
            pacer: Pacer::new(pacing),
            hold_timer,
            progress_paused: AtomicBool::new(false),
            hold_take_delay_us: AtomicU64::new(0),
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
        super::exit::register(&shared);
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("roxe-progress {addr}"))
            .spawn(move || s.progress())?;
        let mut device = Device {
            shared,
            thread: Some(thread),
            steering_thread: None,
            pid: std::process::id(),
        };
        if let (Some(st), Some(nudged)) = (&device.shared.steering, nudged) {
            // The progress thread answers this process's probe.
            st.reconcile(&device.shared.socket)?;
            let s = Arc::clone(&device.shared);
            device.steering_thread = Some(
                std::thread::Builder::new()
                    .name(format!("roxe-steering {addr}"))
                    .spawn(move || {
                        if let Some(st) = &s.steering {
                            st.serve(&s.socket, nudged, || s.stop.load(Ordering::Acquire));
                        }
                    })?,
            );
            tracing::info!(%addr, slot = st.slot(), "address shared with this user's other processes");
        }
        Ok(device)
    }

    /// Progress in the caller's thread, for a `poll_cq` that found nothing:
    /// receive one burst from the socket and handle it (completions, ACKs,
    /// replies), unless another thread is receiving. A completion then
    /// needs no hand-over from the progress thread. That thread still
    /// sleeps on the socket too, unless the
    /// pacer lets this caller hold it (`Pacer::empty_poll`): callers may
    /// stop polling at any moment without saying so (perftest's
    /// `ib_write_lat` spins on its buffer between polls). Does nothing
    /// where the progress thread must receive (raw receive, `busy_poll`)
    /// or with `caller_progress` off.
    pub fn progress_here(&self) -> CallerReceive {
        let s = &*self.shared;
        let now = s.now();
        let poll = s.pacer.empty_poll(now);
        if !poll.receive {
            return CallerReceive::NotHere;
        }
        if let Some(hold) = poll.arm_hold {
            // The timer is armed before the hold is taken: a hold never
            // stands without the timer that ends it.
            if s.arm_hold_timer(hold).is_ok() {
                let delay = s.hold_take_delay_us.load(Ordering::Relaxed);
                if delay > 0 {
                    std::thread::sleep(std::time::Duration::from_micros(delay));
                }
                s.pacer.hold_armed(now);
                if s.pacer.hold_outlived(now, s.now()) {
                    s.end_hold();
                }
            }
        }
        if let Some(sleep) = poll.sleep {
            super::slack::sleep_in_program_thread(sleep);
        }
        let Some(mut rx) = s.rx.try_lock() else {
            return CallerReceive::NotHere;
        };
        let mut guard = None;
        s.receive_udp(&mut rx, &mut guard);
        drop(rx);
        let received = guard.is_some();
        // A caller that receives fires the engine's due timers too: while
        // it holds the socket the progress thread leaves them to it
        // (`Pacer::progress_deadline`). An empty poll decides by its own
        // clock reading (due then is due now); the timers fire by one
        // taken under the lock, as every pass's.
        if guard.is_none() && s.pacer.timer_due(now) {
            guard = Some(s.core.lock());
        }
        let Some(mut core) = guard else {
            return CallerReceive::Nothing;
        };
        let now = s.now();
        if core.engine.poll_timeout().is_some_and(|d| now >= d) {
            core.stats.caller_timers += 1;
            core.engine.handle_timeout(now);
        }
        if received {
            core.stats.rx_caller_batches += 1;
        }
        let batch = s.after_work(&mut core, false);
        MutexGuard::unlock_fair(core);
        s.send_batch(batch);
        if received {
            CallerReceive::Handled
        } else {
            CallerReceive::Nothing
        }
    }

    /// A caller spinning on a CQ found it empty
    /// [`EMPTY_POLLS_BEFORE_YIELD`](super::pacing::EMPTY_POLLS_BEFORE_YIELD)
    /// times in a row, its last [`progress_here`](Self::progress_here)
    /// having done `last`: whether it yields its core to the progress
    /// thread (`Pacer::caller_yields`).
    pub fn caller_yields(&self, last: CallerReceive) -> bool {
        let s = &*self.shared;
        s.pacer.caller_yields(s.now(), last)
    }

    /// The program is about to sleep (a completion notification was
    /// armed): the progress thread takes the socket back now, and starts
    /// no coalescing sleep that would delay the event.
    pub fn caller_sleeps(&self) {
        if self.shared.pacer.caller_sleeps() {
            self.shared.wake();
        }
    }

    /// An engine time of this device (a completion's, from
    /// `Engine::poll_cq_at`) as wall-clock nanoseconds since the Unix
    /// epoch: monotonic (the engine's clock is `Instant`-based), anchored to
    /// the wall clock once, when the device opened.
    pub fn wallclock_ns(&self, at: Nanos) -> u64 {
        self.shared.epoch_wall_ns.saturating_add(at)
    }

    /// Before a CM listener takes `service_id`: on a shared address,
    /// claim it for this process (EADDRINUSE if another process of the
    /// address listens on it), so that its REQs are steered here.
    pub fn claim_service(&self, service_id: u64) -> io::Result<()> {
        match &self.shared.steering {
            Some(st) => st.listen(&self.shared.socket, service_id),
            None => Ok(()),
        }
    }

    /// A listener on `service_id` is gone: the service is free for the
    /// address's other processes.
    pub fn release_service(&self, service_id: u64) {
        if let Some(st) = &self.shared.steering {
            st.unlisten(service_id);
        }
    }

    /// Packets for another process of a shared address that reached this
    /// device and were dropped (always 0 on an address of its own).
    pub fn misrouted_dropped(&self) -> u64 {
        self.shared.steering.as_ref().map_or(0, |s| s.misrouted())
    }

    /// This process's slot of a shared address's QPN space (0: the
    /// address is the process's alone).
    pub fn qpn_slot(&self) -> u8 {
        self.shared.steering.as_ref().map_or(0, |s| s.slot())
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

    /// The pacing the device runs with (after `open` resolved what its
    /// receive path allows: no caller progress with raw receive or busy
    /// polling).
    pub fn pacing(&self) -> PacingConfig {
        *self.shared.pacer.config()
    }

    /// Write what the capture (`ROXE_PCAP`) holds to its file: for
    /// devices that are never closed (the drop-in librdmacm's, flushed when
    /// the process exits).
    pub fn flush_capture(&self) {
        if let Some(tap) = self.shared.core.lock().tap.as_mut() {
            tap.flush_pending();
        }
    }

    /// Lock the engine for a verbs call other than a send post or a poll
    /// (it may unregister memory: it waits for the batch in flight).
    pub fn engine(&self) -> EngineGuard<'_> {
        self.guard(Verb::Other)
    }

    /// [`engine`](Self::engine) for polling a CQ.
    pub fn engine_for_poll(&self) -> EngineGuard<'_> {
        let s = &*self.shared;
        s.pacer.polled(s.now());
        self.guard(Verb::Poll)
    }

    /// [`engine`](Self::engine) for posting a list of send WRs: a list is
    /// its own batch and goes at once.
    pub fn engine_for_post_list(&self) -> EngineGuard<'_> {
        self.guard(Verb::PostList)
    }

    /// [`engine`](Self::engine) for posting one send WR (`ibv_post_send`
    /// without a list): the pass after it is ACK-clocked
    /// ([`PacingConfig::ack_clocked`]).
    pub fn engine_for_post(&self) -> EngineGuard<'_> {
        self.guard(Verb::SinglePost)
    }

    fn guard(&self, verb: Verb) -> EngineGuard<'_> {
        let mut core = self.shared.core.lock();
        // A verb that may unregister memory (any but posts and polls)
        // waits for the batch in flight (see `Shared::tx`).
        if verb == Verb::Other {
            self.shared.wait_for_batch();
        }
        // Work deferred by earlier calls happens before this one: a verb
        // sees what the drops before it did (a listener destroyed just
        // before another listens on its port has released it).
        self.shared.run_deferred(&mut core);
        EngineGuard {
            core: Some(core),
            shared: &self.shared,
            verb,
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

    /// Stop delivering events of `cq`.
    pub fn detach_channel(&self, cq: CqId) {
        self.shared.core.lock().channels.retain(|(c, _)| *c != cq);
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
                caller_holds: self.shared.pacer.holds_taken(),
                caller_yields: self.shared.pacer.callers_yielded(),
                rx_caller_coalesced: self.shared.pacer.callers_coalesced(),
                ..core.stats
            },
            faults: core.faults.as_ref().map(Faults::stats).unwrap_or_default(),
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // A child of fork(2) drops its parent's device: its threads
            // are not in this process, and its socket, slot and registry
            // entry are still the parent's.
            std::mem::forget(self.thread.take());
            std::mem::forget(self.steering_thread.take());
            return;
        }
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(st) = &self.shared.steering {
            st.wake();
            if let Some(t) = self.steering_thread.take() {
                let _ = t.join();
            }
            st.leave(&self.shared.socket, || close_socket(&self.shared.socket));
        }
        if let Some(tap) = self.shared.core.lock().tap.as_mut() {
            tap.flush();
        }
    }
}
