//! What a device's threads share: the engine and its companions under the
//! device lock ([`Core`]), and beside it the sockets, the batch lock, the
//! pacing state and the hand-over points ([`Shared`]).

use super::batch::{RxBatch, TxBatch};
use super::channel::ChannelShared;
use super::counters::DriverStats;
use super::fault::Faults;
use super::pacing::Pacer;
use super::tap::Tap;
use crate::engine::{CqId, Engine, Nanos, QpEvent};
use parking_lot::{Mutex, MutexGuard};
use std::net::{IpAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

pub(crate) struct Core {
    pub(super) engine: Engine,
    /// Where a pass writes its first packet (before it takes
    /// `Shared::tx`), and where a packet goes through the fault injector
    /// (which may hold it).
    pub(super) tx_buf: Vec<u8>,
    pub(super) faults: Option<Faults>,
    pub(super) tap: Option<Tap>,
    pub(super) channels: Vec<(CqId, Arc<ChannelShared>)>,
    /// Who hears the engine's asynchronous events (`ibv_get_async_event`).
    pub(super) event_sinks: Vec<Weak<EventSink>>,
    pub(super) stats: DriverStats,
}

/// A receiver of a device's asynchronous QP events. It runs on the
/// progress thread under the device lock: it must be quick and must not
/// call back into the device.
pub type EventSink = dyn Fn(QpEvent) + Send + Sync;

/// Work for the engine that must not wait for the device lock where it is
/// created (see [`Device::defer`](super::Device::defer)).
pub type DeferredJob = Box<dyn FnOnce(&mut Engine) + Send>;

/// A receiver of the device's Communication Manager events. It runs under
/// the device lock (on the progress thread or a verb's thread): it must be
/// quick and must not call back into the device.
pub type CmEventSink = dyn Fn(crate::cm::CmEvent) + Send + Sync;

pub(super) struct Shared {
    pub(super) addr: IpAddr,
    /// Destinations the kernel routes to from `addr` ([`Device::check_route`]).
    pub(super) routes: Mutex<std::collections::HashSet<IpAddr>>,
    pub(super) socket: UdpSocket,
    /// On a shared address, this process's slot and the steering of the
    /// address's packets (`steering`).
    pub(super) steering: Option<super::steering::SharedAddress>,
    /// The sockets packets leave from, one per UDP source port of
    /// `EngineConfig::src_ports` (same order): a pool bound to ephemeral
    /// ports, so QPs spread over source ports as on rxe and NICs; in
    /// shared mode, the device socket alone.
    pub(super) send: Vec<UdpSocket>,
    /// Their UDP source ports, in the same order.
    pub(super) send_ports: Vec<u16>,
    /// `ROXE_ICRC=raw` on an IPv4 device: the `AF_PACKET` socket packets
    /// are received from (see `raw.rs`).
    pub(super) raw: Option<OwnedFd>,
    /// Shared-port mode (beside rxe): `socket` holds the claim port, where
    /// roxe devices on this host send their packets straight (the
    /// batch's `DirectPeers`); they are received from it, not discarded.
    pub(super) direct_rx: bool,
    pub(super) epoch: Instant,
    /// The wall clock (ns since the Unix epoch) at `epoch`: engine times
    /// as wall-clock times (`Device::wallclock_ns`).
    pub(super) epoch_wall_ns: u64,
    pub(super) core: Mutex<Core>,
    /// The packets of a pass, sent together. Taken under `core` (never
    /// the other way round) by a pass that has a packet to send, and held
    /// until the batch has left, which is after `core` is released: the
    /// next pass, and the verbs calls that send nothing (single posts held
    /// for an ACK, polls), need not wait for the system call. Batches
    /// leave in the order passes ran. Payloads sent by reference stay
    /// valid: a verb that may unregister memory first waits for the
    /// batch in flight ([`Shared::wait_for_batch`]), and no later batch
    /// refers to memory it removed.
    pub(super) tx: Mutex<TxBatch>,
    pub(super) wake: OwnedFd,
    /// The deadline the progress thread sleeps towards (`u64::MAX`: none;
    /// 0: it is awake and will look at the timers before sleeping again).
    /// Written and compared under the core lock.
    pub(super) sleeping_until: AtomicU64,
    pub(super) stop: AtomicBool,
    /// Work to run under the core lock at the next pass ([`Device::defer`]).
    pub(super) deferred: Mutex<Vec<DeferredJob>>,
    /// Jobs wait in `deferred`: every verb and pass checks this flag, and
    /// takes the lock only when it is set (the data path never does).
    pub(super) has_deferred: AtomicBool,
    /// Who hears the CM's events (rdma_cm ids). Its own lock (taken inside
    /// the core lock, never around it), so subscribing never waits for the
    /// engine.
    pub(super) cm_sinks: Mutex<Vec<Weak<CmEventSink>>>,
    /// The receive pool. Whoever receives holds it from `recvmmsg` until
    /// the burst is handled, so packets reach the engine in the order the
    /// socket gave them even when a caller's thread and the progress
    /// thread take turns.
    pub(super) rx: Mutex<RxBatch>,
    /// When the threads send, receive and sleep (`pacing.rs`).
    pub(super) pacer: Pacer,
    /// Ends a caller's hold on the socket: a kernel timer, so a caller that
    /// stops polling without notice leaves packets waiting at most
    /// `pacing::CALLER_HOLD` (armed before the hold is taken).
    pub(super) hold_timer: OwnedFd,
    /// Tests: the progress thread does nothing while set
    /// ([`Device::pause_progress_thread`]).
    pub(super) progress_paused: AtomicBool,
    /// Tests: microseconds a caller waits between arming the hold timer
    /// and taking the hold, as a preempted caller would
    /// ([`Device::delay_hold_taking`]).
    pub(super) hold_take_delay_us: AtomicU64,
    /// The progress thread has seen `progress_paused` and does nothing.
    pub(super) progress_parked: AtomicBool,
    /// `roxe stat`'s socket (None where it could not be made).
    pub(super) stat: Option<super::stat::StatServer>,
}

impl Shared {
    pub(super) fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// Arm the hold timer to fire once, `hold` from now (the timer that
    /// ends a caller's hold on the socket).
    pub(super) fn arm_hold_timer(&self, hold: std::time::Duration) -> std::io::Result<()> {
        let spec = rustix::time::Itimerspec {
            it_interval: rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: rustix::time::Timespec {
                tv_sec: hold.as_secs() as _,
                tv_nsec: hold.subsec_nanos() as _,
            },
        };
        let flags = rustix::time::TimerfdTimerFlags::empty();
        rustix::time::timerfd_settime(&self.hold_timer, flags, &spec)?;
        Ok(())
    }

    /// End a caller's hold on the socket now: the progress thread, asleep
    /// without the socket, is woken.
    pub(super) fn end_hold(&self) {
        if self.pacer.end_hold() {
            self.wake();
        }
    }

    pub(super) fn wake(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    pub(super) fn run_deferred(&self, core: &mut Core) {
        // A plain load first: the swap is a locked write on every verb.
        if !self.has_deferred.load(Ordering::Acquire)
            || !self.has_deferred.swap(false, Ordering::AcqRel)
        {
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
    pub(super) fn wait_for_batch(&self) {
        drop(self.tx.lock());
    }

    /// Send the batch `after_work` returned, after the device lock is
    /// released.
    pub(super) fn send_batch(&self, tx: Option<MutexGuard<'_, TxBatch>>) {
        if let Some(mut tx) = tx {
            if !tx.is_empty() {
                tx.flush(&self.send[..]);
            }
        }
    }
}

pub(super) fn earliest(a: Option<Nanos>, b: Option<Nanos>) -> Option<Nanos> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}
