//! When a device's threads send, receive and sleep: every pacing decision
//! of the driver, in one sans-IO object.
//!
//! A device has two kinds of threads: the program's (verbs calls: posts,
//! polls, ...) and its progress thread (receives, fires timers, serves
//! programs that sleep on a completion channel). Which of them receives a
//! datagram, whether a pass sends a new message now or lets it wait for the
//! ACK on its way, and how long the progress thread sleeps decide the
//! speed on a small machine: every wake-up of another thread is a
//! scheduler round trip, and on two vCPUs a woken thread preempts the
//! peer. [`Pacer`] takes the events (a verb's pass and its kind, an empty
//! poll, a receive burst and its shape, a notification armed, the progress
//! thread's pass and sleep) with the time they happen at, and returns
//! decisions; `device.rs` carries them out (sockets, timers, the lock).
//! It reads no clock and touches no socket: `tests` drive it on a virtual
//! clock.
//!
//! The decisions, and the events they follow:
//!
//! | decision | made at | rule |
//! | --- | --- | --- |
//! | a verb's pass is ACK-clocked | [`Pacer::verb_pass`] | a single post's always; a poll's while [`POLL_CLOCKED_QUEUE`] messages are queued; never a post list's |
//! | the progress thread's pass is ACK-clocked | [`Pacer::progress_pass`] | when a caller polled within the handover window, has not armed a notification since, and messages wait for the ACK: that caller sends them |
//! | a caller holds the socket | [`Pacer::empty_poll`] | while a stream comes in ([`STREAM_BURST`]) or post lists stream out ([`STREAM_SEND_QUEUE`]), or while it spins on its CQ ([`SPINNING_POLL_GAP`]); from [`MIN_CALLER_HOLD`], doubling per re-arm up to [`CALLER_HOLD`] |
//! | holds start short again | [`Pacer::hold_stranded`] | a hold's timer ended it with datagrams waiting |
//! | the holder fires the engine's timers | [`Pacer::progress_deadline`] | while a hold stands the progress thread sleeps past them |
//! | the hold ends | [`Pacer::caller_sleeps`], [`Pacer::hold_outlived`], the hold's timer | a notification is armed; the caller took the hold a whole hold after arming its timer; the caller stopped polling |
//! | a caller sleeps before receiving | [`Pacer::empty_poll`] | after two bulk bursts in a row, unless the device's READs are owed no more than two such bursts bring ([`Burst::read_due`]) |
//! | the progress thread coalesces | [`Pacer::progress_sleep`] | after a bulk burst ([`RX_BULK_BURST`]) |
//! | the progress thread spins instead of sleeping | [`Pacer::progress_spins`] | busy polling; or within [`SPIN_AFTER_BURST`] of a burst while the program has not polled for [`PASSIVE_AFTER`] |
//! | a spinning progress thread yields its core | [`Pacer::busy_pass_yields`] | after a pass that neither received nor sent |
//! | a caller spinning on an empty CQ yields its core | [`Pacer::caller_yields`] | every [`EMPTY_POLLS_BEFORE_YIELD`] empty polls, if the progress thread has work the caller cannot do (a timer due, receiving the caller could not do) or nothing came for [`QUIET_BEFORE_YIELD`] |
//!
//! Several threads call it at once, so its state is atomics; each rule
//! reads and writes it in one place. The measurements behind each constant
//! are in docs/PERFORMANCE.md.

use super::config::{parse_micros, parse_switch, ConfigError};
use super::shared::earliest;
use crate::engine::{Load, Nanos};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// How the device paces its threads. Each knob trades something; the
/// defaults are what measured best on a 2-vCPU machine over loopback
/// (docs/PERFORMANCE.md), and `ROXE_*` variables change them
/// ([`PacingConfig::from_env`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacingConfig {
    /// The progress thread spins instead of sleeping (`ROXE_BUSY_POLL`,
    /// default off). Lowest latency for programs that sleep on a channel,
    /// at the price of a core always busy.
    pub busy_poll: bool,
    /// Runs of equal packets to one peer leave as one UDP GSO send and
    /// arrive through GRO (`ROXE_GSO`, default on): one system call per
    /// run instead of per packet. Off for a NIC whose segmentation offload
    /// numbers segments in a way a peer rejects.
    pub gso: bool,
    /// A `poll_cq` that finds nothing receives from the socket itself, in
    /// the caller's thread (`ROXE_CALLER_PROGRESS`, default on): a
    /// completion then needs no wake-up of the progress thread. Off, only
    /// the progress thread receives (what a program that polls rarely
    /// might prefer: its polls stay cheap).
    pub caller_progress: bool,
    /// A caller spinning on an empty CQ, or polling while a stream flows,
    /// keeps the socket from the progress thread (`ROXE_CALLER_HOLD`,
    /// default on), for at most [`CALLER_HOLD`] after its last poll, and
    /// fires the engine's timers itself: the progress thread would
    /// otherwise be woken by every datagram, only to find it taken, and
    /// preempt the peer. Needs `caller_progress`.
    pub caller_hold: bool,
    /// After a single send post, a reliable QP's new message waits while
    /// 16 or more PSNs of the device are unacknowledged (a message under
    /// 1 KiB: two or more messages), and the pass the
    /// coming ACK starts sends it with what was posted meanwhile
    /// (`ROXE_ACK_CLOCKED`, default on): one system call for many posts.
    /// A latency-bound program (one message at a time) never waits.
    pub ack_clocked: bool,
    /// Payloads of 1 KiB or more in one registered region leave straight
    /// from it (an iovec), not copied into the transmit buffer first
    /// (`ROXE_TX_BY_REF`, default on). A deregistration then waits for the
    /// batch being sent.
    pub payload_by_ref: bool,
    /// After a bulk receive burst the progress thread sleeps this long
    /// without the socket, then receives what came as one burst
    /// (`ROXE_RX_COALESCE_US`, microseconds, default 20, at most 1000; 0:
    /// off): a bulk stream wakes it once per interval instead of once per
    /// datagram. Latency-bound traffic never triggers it.
    pub rx_coalesce: Duration,
    /// A QP playing a WRITE ping-pong holds the ACK of each WRITE it
    /// receives until its own answer leaves, at most a few turnarounds
    /// (`ROXE_ACK_HOLD`, default on; `EngineConfig::hold_acks`): a peer
    /// that polls memory for the answer (`ib_write_lat`) then receives it
    /// in the `poll_cq` that waits for the ACK, not through a wake-up of
    /// its progress thread.
    pub ack_hold: bool,
    /// How recently a caller must have polled for the progress thread to
    /// leave it the messages an ACK unblocked (default 20 µs): a caller
    /// spinning on the CQ sends them with its next poll instead of the
    /// progress thread holding the device lock while the caller waits.
    pub handover_window: Duration,
    /// A progress thread that just received spins on for
    /// [`SPIN_AFTER_BURST`] instead of sleeping, while the program has not
    /// polled a CQ for [`PASSIVE_AFTER`] (`ROXE_PROGRESS_SPIN`, default
    /// on): a passive side (a WRITE or READ target, a program asleep on a
    /// channel) then takes the next burst without a wake-up. A program
    /// that polls receives for itself and keeps its core.
    pub spin_after_traffic: bool,
}

impl Default for PacingConfig {
    fn default() -> Self {
        PacingConfig {
            busy_poll: false,
            gso: true,
            caller_progress: true,
            caller_hold: true,
            ack_clocked: true,
            payload_by_ref: true,
            ack_hold: true,
            rx_coalesce: Duration::from_micros(20),
            handover_window: Duration::from_micros(20),
            spin_after_traffic: true,
        }
    }
}

impl PacingConfig {
    /// The defaults, changed by the environment: `ROXE_BUSY_POLL`,
    /// `ROXE_GSO`, `ROXE_CALLER_PROGRESS`, `ROXE_CALLER_HOLD`,
    /// `ROXE_ACK_CLOCKED`, `ROXE_TX_BY_REF`, `ROXE_ACK_HOLD`,
    /// `ROXE_PROGRESS_SPIN` (switches: [`parse_switch`])
    /// and `ROXE_RX_COALESCE_US` (0..=1000). A value that does not parse
    /// is an error naming its variable.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// [`from_env`](Self::from_env) with the variables from `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let var = |k: &str| lookup(k).filter(|v| !v.is_empty());
        let mut c = PacingConfig::default();
        let switches: [(&'static str, &mut bool); 8] = [
            ("ROXE_BUSY_POLL", &mut c.busy_poll),
            ("ROXE_GSO", &mut c.gso),
            ("ROXE_CALLER_PROGRESS", &mut c.caller_progress),
            ("ROXE_CALLER_HOLD", &mut c.caller_hold),
            ("ROXE_ACK_CLOCKED", &mut c.ack_clocked),
            ("ROXE_TX_BY_REF", &mut c.payload_by_ref),
            ("ROXE_ACK_HOLD", &mut c.ack_hold),
            ("ROXE_PROGRESS_SPIN", &mut c.spin_after_traffic),
        ];
        for (name, field) in switches {
            if let Some(v) = var(name) {
                *field = parse_switch(name, &v)?;
            }
        }
        if let Some(v) = var("ROXE_RX_COALESCE_US") {
            let us = parse_micros("ROXE_RX_COALESCE_US", &v, 1000)?;
            c.rx_coalesce = Duration::from_micros(u64::from(us));
        }
        Ok(c)
    }

    fn rx_coalesce_ns(&self) -> Nanos {
        self.rx_coalesce.as_nanos() as Nanos
    }
}

/// The longest a caller's empty poll keeps the socket from the progress
/// thread. A hold begins at [`MIN_CALLER_HOLD`] and doubles each time the
/// polling caller re-arms it (once half of it has passed), up to this;
/// it falls back to the minimum whenever one ended with datagrams waiting
/// ([`Pacer::hold_stranded`]). The length bounds how long datagrams wait
/// unreceived after a program stops polling without saying so (it spins
/// on memory, or leaves to do other work); it is long because re-arming
/// costs: a timer due before the next scheduler tick (4 ms at `HZ=250`)
/// reprograms the CPU's timer, which in a virtual machine is an exit,
/// 10 µs here. At 100 µs, re-armed every 50, that was a fifth of a
/// spinning core and 4-5 µs on one in five ping-pong turns
/// (docs/PERFORMANCE.md, session 26). A program that sleeps on a
/// completion channel ends the hold when it arms the notification.
pub const CALLER_HOLD: Nanos = 5_000_000;
/// The first hold, and the first after one that stranded datagrams: a
/// program that stops polling while its peer sends (the first turns of a
/// ping-pong, before its ACKs are held) loses at most this.
pub const MIN_CALLER_HOLD: Nanos = 100_000;
/// A caller whose polls come less than this apart spins on its CQ: it
/// holds the socket, so that its peer's datagrams, which it receives
/// itself, do not also wake the progress thread (on two vCPUs a woken
/// thread preempts one of two spinning programs: 1 % of a ping-pong's
/// turns). Wider than the gap between a ping-pong's polls (one turn,
/// under 20 µs here) yet far below [`CALLER_HOLD`].
pub const SPINNING_POLL_GAP: Nanos = 20_000;
/// A receive burst that ends this many messages or more: the device
/// receives a stream.
pub const STREAM_BURST: u32 = 8;
/// This many messages posted and not completed, in packets of two or
/// fewer: the device sends a stream of small messages.
pub const STREAM_SEND_QUEUE: usize = 16;
/// A poll's pass is ACK-clocked (its new messages wait for the ACK on its
/// way, as a single post's do) while this many messages are queued: a
/// stream of single posts. Below, a ping-pong's next message leaves at
/// once.
pub const POLL_CLOCKED_QUEUE: usize = 8;
/// A receive burst of at least this many bytes, in packets of
/// [`RX_BULK_PACKET`] bytes or more on average, that ends two messages or
/// stops inside one, is bulk data. Not a stream of small messages (their
/// senders wait on prompt ACKs), nor one whole message (a ping-pong's
/// answer would come during the sleep).
pub const RX_BULK_BURST: usize = 32 * 1024;
/// See [`RX_BULK_BURST`].
pub const RX_BULK_PACKET: usize = 1024;
/// A burst of READ responses after which the device's READs are owed no
/// more than this many bursts as large is not bulk ([`Burst::read_due`]).
pub const READ_TAIL_BURSTS: u64 = 2;
/// A caller that polled one CQ this many times in a row without finding
/// anything asks [`Pacer::caller_yields`] whether to yield its core.
pub const EMPTY_POLLS_BEFORE_YIELD: u32 = 64;
/// A caller spinning on an empty CQ yields its core once nothing has been
/// received for this long ([`Pacer::caller_yields`]): longer than a
/// ping-pong's turn on this host, so a ping-pong's caller keeps its core,
/// and far shorter than a scheduler slice, which a peer sharing the core
/// would otherwise wait out.
pub const QUIET_BEFORE_YIELD: Nanos = 50_000;
/// How soon the progress thread sends what it left to a caller that did
/// not poll again.
pub const HANDOVER_FALLBACK: Duration = Duration::from_micros(50);
/// How long a progress thread spins on after the last burst it received
/// ([`PacingConfig::spin_after_traffic`]): longer than the gap between
/// a stream's bursts on this host (a program posting its next hundred
/// small messages), short enough that a finished stream leaves no core
/// busy.
pub const SPIN_AFTER_BURST: Nanos = 100_000;
/// A program that has not polled a CQ for this long does not receive for
/// itself: the progress thread may spin for it.
pub const PASSIVE_AFTER: Nanos = 1_000_000;
/// The progress thread's longest sleep (it re-checks its stop flag).
pub const MAX_SLEEP: Duration = Duration::from_millis(100);

/// What a verb took the device for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// Any verb but a send post or a poll.
    Other,
    /// One send WR.
    SinglePost,
    /// A list of send WRs.
    PostList,
    /// A CQ poll.
    Poll,
}

/// The shape of a receive burst.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Burst {
    /// UDP payload bytes.
    pub bytes: usize,
    /// Packets (a GRO datagram counts its segments).
    pub packets: usize,
    /// Packets that end a message.
    pub messages: u32,
    /// The last packet ends a message.
    pub last_ends: bool,
    /// Every packet was a READ response: then the bytes the device's READs
    /// were still owed after it (counted no further than past
    /// [`READ_TAIL_BURSTS`] times `bytes`; see
    /// [`Engine::read_bytes_due`](crate::engine::Engine::read_bytes_due)),
    /// else `None`.
    pub read_due: Option<u64>,
}

impl Burst {
    /// The burst brought READ responses, and what its READs still owe
    /// would come in two more bursts as large: the end of the READs is
    /// near and known, so nobody sleeps to coalesce it (a sleep would
    /// delay the completion by its rest; two, because the sleep the last
    /// burst arrives in began after the one before).
    fn ends_reads(&self) -> bool {
        self.read_due
            .is_some_and(|due| due <= READ_TAIL_BURSTS * self.bytes as u64)
    }
}

/// What a caller's empty poll does before it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmptyPoll {
    /// Receive at all (`caller_progress`).
    pub receive: bool,
    /// Sleep this long first (a bulk stream: the rest of the coalescing
    /// interval).
    pub sleep: Option<Duration>,
    /// (Re-)arm the hold timer for this long, then call
    /// [`Pacer::hold_armed`].
    pub arm_hold: Option<Duration>,
}

/// What a caller's receive for an empty poll did
/// ([`Device::progress_here`](super::Device::progress_here)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerReceive {
    /// It handled packets.
    Handled,
    /// It found the socket empty.
    Nothing,
    /// It did not receive: caller progress is off (or impossible: raw
    /// receive, a busy-polling progress thread), or another thread was
    /// receiving.
    NotHere,
}

/// How the progress thread sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sleep {
    /// At most this long.
    pub duration: Duration,
    /// Datagrams on the socket end it (not while a caller holds the socket
    /// or while coalescing).
    pub watch_socket: bool,
    /// A coalescing sleep (counted).
    pub coalescing: bool,
}

/// The pacing state of one device (see the module documentation).
#[derive(Debug)]
pub struct Pacer {
    config: PacingConfig,
    /// A caller holds the socket.
    hold_on: AtomicBool,
    /// When the hold timer was last armed (engine ns).
    hold_armed_at: AtomicU64,
    /// The length of the hold armed last, or of the next one (from
    /// [`MIN_CALLER_HOLD`] up to [`CALLER_HOLD`]).
    hold_len: AtomicU64,
    /// Holds taken (from none).
    holds_taken: AtomicU64,
    /// The last burst ended [`STREAM_BURST`] messages or more.
    stream_in: AtomicBool,
    /// Post lists stream small messages out ([`Load::streams_out`]).
    stream_out: AtomicBool,
    /// When a caller last polled a CQ (engine ns).
    caller_polled_at: AtomicU64,
    /// The progress thread left the messages an ACK unblocked to a polling
    /// caller; its next poll's pass sends them.
    left_to_caller: AtomicBool,
    /// The last burst was bulk; cleared by the coalescing sleep that
    /// follows it and by a notification being armed.
    rx_bulk: AtomicBool,
    /// Bulk bursts in a row.
    rx_bulk_run: AtomicU32,
    /// When the last of two or more bulk bursts in a row came (0: none).
    rx_bulk_at: AtomicU64,
    /// The progress thread is in (or about to start) a coalescing sleep.
    rx_coalescing: AtomicBool,
    /// Sleeps callers took before receiving.
    caller_coalesced: AtomicU64,
    /// The engine's earliest timer, which the progress thread fires
    /// (engine ns; `u64::MAX`: none), as the last pass of any thread left
    /// it. Unlike `Shared::sleeping_until` it stays set while the thread
    /// is awake.
    progress_timer_at: AtomicU64,
    /// Yields [`caller_yields`](Self::caller_yields) granted.
    callers_yielded: AtomicU64,
    /// When the last receive burst was handed to the engine (engine ns).
    last_burst_at: AtomicU64,
}

impl Pacer {
    /// A pacer with `config`, nothing flowing.
    pub fn new(config: PacingConfig) -> Pacer {
        Pacer {
            config,
            hold_on: AtomicBool::new(false),
            hold_armed_at: AtomicU64::new(0),
            hold_len: AtomicU64::new(MIN_CALLER_HOLD),
            holds_taken: AtomicU64::new(0),
            stream_in: AtomicBool::new(false),
            stream_out: AtomicBool::new(false),
            caller_polled_at: AtomicU64::new(0),
            left_to_caller: AtomicBool::new(false),
            rx_bulk: AtomicBool::new(false),
            rx_bulk_run: AtomicU32::new(0),
            rx_bulk_at: AtomicU64::new(0),
            rx_coalescing: AtomicBool::new(false),
            caller_coalesced: AtomicU64::new(0),
            progress_timer_at: AtomicU64::new(u64::MAX),
            callers_yielded: AtomicU64::new(0),
            last_burst_at: AtomicU64::new(0),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &PacingConfig {
        &self.config
    }

    /// A caller polls a CQ at `now` (whatever it finds).
    pub fn polled(&self, now: Nanos) {
        self.caller_polled_at.store(now, Ordering::Relaxed);
    }

    /// Whether the pass after `verb` is ACK-clocked: new messages of
    /// reliable QPs wait while PSNs are unacknowledged, and the pass the
    /// coming ACK starts sends them with what was posted meanwhile. A
    /// single post's always (a stream of single posts then goes as a batch
    /// per ACK); a poll's in a stream of single posts, unless the progress
    /// thread left it held messages to send; never a post list's (a list
    /// is its own batch: holding lists back left each of 1,024 QPs one
    /// message in flight).
    pub fn verb_pass(&self, verb: Verb, load: impl FnOnce() -> Load) -> bool {
        let left_here = verb == Verb::Poll && self.left_to_caller.swap(false, Ordering::AcqRel);
        self.config.ack_clocked
            && !left_here
            && match verb {
                Verb::SinglePost => true,
                Verb::Poll => load().queued >= POLL_CLOCKED_QUEUE,
                Verb::Other | Verb::PostList => false,
            }
    }

    /// After the pass of `verb`, with the engine's `load` then. A caller's
    /// hold stands even when the pass left a message waiting for an ACK:
    /// the program's next poll receives the ACK, and the pass after it
    /// sends what waits. (Ending the hold there, so that the progress
    /// thread would receive that ACK, cost a timer re-arm and a wake-up
    /// per burst of posts: 10,000 of each a second under `ib_send_bw -s
    /// 64`, and 64 B `ib_write_bw` ran at 0.94-1.28 M messages/s against
    /// 1.52-1.68 without; docs/PERFORMANCE.md, session 26.)
    pub fn verb_done(&self, verb: Verb, load: impl Fn() -> Load) {
        match verb {
            // A stream of single posts is ACK-clocked: the pass the ACK
            // starts sends what waits.
            Verb::SinglePost => self.stream_out.store(false, Ordering::Relaxed),
            // A stream of post lists goes without ACKs' help: callers
            // receive.
            Verb::PostList => self
                .stream_out
                .store(load().sends_stream(STREAM_SEND_QUEUE), Ordering::Relaxed),
            Verb::Other | Verb::Poll => {}
        }
    }

    /// After any pass: a stream sent ends when its messages are done.
    pub fn pass_done(&self, load: impl FnOnce() -> Load) {
        if self.stream_out.load(Ordering::Relaxed) && !load().sends_stream(STREAM_SEND_QUEUE) {
            self.stream_out.store(false, Ordering::Relaxed);
        }
    }

    /// A caller's `poll_cq` found nothing at `now`: what it does before it
    /// receives itself.
    pub fn empty_poll(&self, now: Nanos) -> EmptyPoll {
        let previous = self.caller_polled_at.swap(now, Ordering::Relaxed);
        if !self.config.caller_progress {
            return EmptyPoll {
                receive: false,
                sleep: None,
                arm_hold: None,
            };
        }
        let streaming =
            self.stream_in.load(Ordering::Relaxed) || self.stream_out.load(Ordering::Relaxed);
        // (0: no poll yet.)
        let spinning = previous > 0 && now.saturating_sub(previous) < SPINNING_POLL_GAP;
        let held = self.hold_on.load(Ordering::Acquire);
        let len = self.hold_len.load(Ordering::Relaxed);
        // Re-armed once half of it has passed, so a caller spinning on the
        // CQ never lets it lapse, whatever its polls cost. (A count of 64
        // polls lapsed under UCX, whose polls come 2 µs or more apart.)
        let due =
            !held || now.saturating_sub(self.hold_armed_at.load(Ordering::Relaxed)) >= len / 2;
        let arm_hold = (self.config.caller_hold && (streaming || spinning) && due).then(|| {
            let len = if held {
                let longer = (2 * len).min(CALLER_HOLD);
                self.hold_len.store(longer, Ordering::Relaxed);
                longer
            } else {
                len
            };
            Duration::from_nanos(len)
        });
        // In a bulk stream a spinning caller sleeps out the rest of the
        // coalescing interval, leaving the core to the peer's sender, and
        // then takes a larger burst.
        let bulk_at = self.rx_bulk_at.load(Ordering::Relaxed);
        let until = bulk_at.saturating_add(self.config.rx_coalesce_ns());
        let sleep = (bulk_at > 0 && now < until).then(|| {
            self.caller_coalesced.fetch_add(1, Ordering::Relaxed);
            Duration::from_nanos(until - now)
        });
        EmptyPoll {
            receive: true,
            sleep,
            arm_hold,
        }
    }

    /// The hold timer was (re-)armed as [`EmptyPoll::arm_hold`] asked: the
    /// caller holds the socket. (Set only once the timer is armed, so a
    /// hold never stands without the timer that ends it, unless that
    /// timer fired first: [`hold_outlived`](Self::hold_outlived).)
    pub fn hold_armed(&self, now: Nanos) {
        self.hold_armed_at.store(now, Ordering::Relaxed);
        if !self.hold_on.swap(true, Ordering::AcqRel) {
            self.holds_taken.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether a hold whose timer was armed at `armed_at` (then taken with
    /// [`hold_armed`](Self::hold_armed)) must be ended by the caller at
    /// `now`: a caller preempted for a whole hold between arming the
    /// timer and taking the hold may have taken it after the timer fired
    /// and the progress thread ended it. Nothing would end it then, and a
    /// program that stops polling the CQ (one waiting on memory) would
    /// leave its datagrams unreceived for as long as it waits. Before
    /// `armed_at` + the hold's length the timer has not fired, and its
    /// firing ends the hold taken.
    pub fn hold_outlived(&self, armed_at: Nanos, now: Nanos) -> bool {
        now.saturating_sub(armed_at) >= self.hold_len.load(Ordering::Relaxed)
    }

    /// A hold's timer ended it and the progress thread then found
    /// datagrams waiting: the caller had stopped polling while its peer
    /// sent. The next holds start short again ([`MIN_CALLER_HOLD`]).
    pub fn hold_stranded(&self) {
        self.hold_len.store(MIN_CALLER_HOLD, Ordering::Relaxed);
    }

    /// How long the next hold lasts (hooks, tests).
    #[cfg(any(test, feature = "testing"))]
    pub fn hold_len(&self) -> Nanos {
        self.hold_len.load(Ordering::Relaxed)
    }

    /// End a caller's hold; true if there was one (the progress thread is
    /// to be woken: it sleeps without the socket).
    pub fn end_hold(&self) -> bool {
        self.hold_on.swap(false, Ordering::AcqRel)
    }

    /// The hold timer fired.
    pub fn hold_expired(&self) {
        self.hold_on.store(false, Ordering::Release);
    }

    /// Whether the progress thread receives now (no caller holds the
    /// socket).
    pub fn progress_receives(&self) -> bool {
        !self.hold_on.load(Ordering::Acquire)
    }

    /// The program is about to sleep (it armed a completion notification):
    /// the progress thread takes the socket back and starts no coalescing
    /// sleep. True if it is to be woken now.
    pub fn caller_sleeps(&self) -> bool {
        // A sleeping caller polls no more: messages an ACK releases are
        // the progress thread's to send, not left for a poll that would
        // come only after the fallback wait.
        self.caller_polled_at.store(0, Ordering::Relaxed);
        let left = self.left_to_caller.load(Ordering::Acquire);
        // Either the progress thread sees `rx_bulk` cleared, or this sees
        // it coalescing and wakes it (both SeqCst; see `progress_sleep`).
        self.rx_bulk.store(false, Ordering::SeqCst);
        let coalescing = self.rx_coalescing.load(Ordering::SeqCst);
        self.end_hold() || coalescing || left
    }

    /// A receive burst of `shape` was handed to the engine at `now`.
    pub fn burst(&self, now: Nanos, shape: Burst) {
        self.last_burst_at.store(now, Ordering::Relaxed);
        self.stream_in
            .store(shape.messages >= STREAM_BURST, Ordering::Relaxed);
        let bulk = shape.bytes >= RX_BULK_BURST
            && shape.bytes >= shape.packets * RX_BULK_PACKET
            && (shape.messages >= 2 || !shape.last_ends)
            && !shape.ends_reads();
        self.rx_bulk.store(bulk, Ordering::Relaxed);
        let run = if bulk {
            self.rx_bulk_run.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.rx_bulk_run.store(0, Ordering::Relaxed);
            0
        };
        // One message split over two bursts (a 64 KiB ping-pong's) makes
        // no run: only a stream makes callers sleep.
        self.rx_bulk_at
            .store(if run >= 2 { now.max(1) } else { 0 }, Ordering::Relaxed);
    }

    /// Whether the progress thread's pass at `now` is ACK-clocked: when a
    /// caller polled within the handover window and messages wait for the
    /// ACK this pass handles, that caller sends them with its next poll
    /// (it spins anyway) instead of this thread sending them while holding
    /// the lock the caller waits for.
    pub fn progress_pass(&self, now: Nanos, load: impl FnOnce() -> Load) -> bool {
        let polled = self.caller_polled_at.load(Ordering::Relaxed);
        let window = self.config.handover_window.as_nanos() as Nanos;
        self.config.ack_clocked && now.saturating_sub(polled) < window && load().held
    }

    /// After the progress thread's pass (`handover`: it was ACK-clocked for
    /// a caller), with the engine's `load` then. True if messages were
    /// left to the caller (the progress thread then sleeps at most
    /// [`HANDOVER_FALLBACK`]).
    pub fn progress_pass_done(&self, handover: bool, load: impl FnOnce() -> Load) -> bool {
        let left = handover && load().held;
        self.left_to_caller.store(left, Ordering::Release);
        left
    }

    /// How the progress thread sleeps at `now`, its next timer at
    /// `deadline`, having `left` messages to a caller.
    pub fn progress_sleep(&self, now: Nanos, deadline: Option<Nanos>, left: bool) -> Sleep {
        let until_deadline = deadline
            .map(|d| Duration::from_nanos(d.saturating_sub(now)))
            .unwrap_or(Duration::MAX);
        let held = self.hold_on.load(Ordering::Acquire);
        // `rx_coalescing` is set before `rx_bulk` is taken; a caller arming
        // a notification clears `rx_bulk` before it reads `rx_coalescing`:
        // either this sees the cleared flag, or the caller sees this one and
        // wakes the thread.
        let coalescing = self.config.rx_coalesce_ns() > 0
            && !held
            && until_deadline > self.config.rx_coalesce
            && {
                self.rx_coalescing.store(true, Ordering::SeqCst);
                let bulk = self.rx_bulk.swap(false, Ordering::SeqCst);
                if !bulk {
                    self.rx_coalescing.store(false, Ordering::Relaxed);
                }
                bulk
            };
        let mut duration = if coalescing {
            self.config.rx_coalesce
        } else {
            until_deadline.min(MAX_SLEEP)
        };
        if left {
            duration = duration.min(HANDOVER_FALLBACK);
        }
        Sleep {
            duration,
            watch_socket: !(held || coalescing),
            coalescing,
        }
    }

    /// A spinning progress thread's pass `received` packets or `sent`
    /// some: whether it yields its core before the next pass. A pass that
    /// found no work yields: with more spinning threads than cores (two
    /// processes on two vCPUs, each program polling its CQ beside its own
    /// busy progress thread) a plain spin kept the thread that had the
    /// work off its core for a scheduler slice, 4.3 ms per message
    /// (docs/PERFORMANCE.md, session 20). A pass that worked spins on: more
    /// is likely to follow at once.
    pub fn busy_pass_yields(&self, received: bool, sent: bool) -> bool {
        !received && !sent
    }

    /// Whether the progress thread spins at `now` instead of sleeping:
    /// always with `busy_poll`; else within [`SPIN_AFTER_BURST`] of the
    /// last burst, while no caller has polled for [`PASSIVE_AFTER`] (nor
    /// holds the socket) and no bulk stream is being coalesced.
    pub fn progress_spins(&self, now: Nanos) -> bool {
        if self.config.busy_poll {
            return true;
        }
        let last = self.last_burst_at.load(Ordering::Relaxed);
        let polled = self.caller_polled_at.load(Ordering::Relaxed);
        self.config.spin_after_traffic
            && last > 0
            && now.saturating_sub(last) < SPIN_AFTER_BURST
            && now.saturating_sub(polled) >= PASSIVE_AFTER
            && !self.hold_on.load(Ordering::Acquire)
            && !self.rx_bulk.load(Ordering::Relaxed)
    }

    /// After a pass (any thread's, under the device lock): the engine's
    /// earliest timer is now at `deadline` (`None`: none), which the
    /// progress thread fires.
    pub fn timers_at(&self, deadline: Option<Nanos>) {
        self.progress_timer_at
            .store(deadline.unwrap_or(u64::MAX), Ordering::Release);
    }

    /// Whether the earliest timer the progress thread fires (engine or
    /// fault injector) is due at `now`.
    pub fn timer_due(&self, now: Nanos) -> bool {
        now >= self.progress_timer_at.load(Ordering::Acquire)
    }

    /// A caller found its CQ empty [`EMPTY_POLLS_BEFORE_YIELD`] times in a
    /// row, at `now`, its last receive having done `last`. Whether it
    /// yields its core: to let the progress thread do what the caller
    /// cannot (fire a timer that is due, receive while the caller could
    /// not), or when nothing has come for [`QUIET_BEFORE_YIELD`], so that
    /// a peer process sharing this core (two programs spinning on two
    /// vCPUs) gets to answer. A yield otherwise hands the core to a
    /// progress thread that a datagram woke only to find the caller had
    /// taken it, and on Linux's EEVDF each yield moves the caller's
    /// deadline a slice later, so that every later wake-up of that thread
    /// preempts it (docs/PERFORMANCE.md, session 23: UCX's progress loop,
    /// polling four CQs of which two never complete, yielded 4,800 times a
    /// second).
    pub fn caller_yields(&self, now: Nanos, last: CallerReceive) -> bool {
        let quiet = now.saturating_sub(self.last_burst_at.load(Ordering::Relaxed));
        let yields =
            last == CallerReceive::NotHere || self.timer_due(now) || quiet >= QUIET_BEFORE_YIELD;
        if yields {
            self.callers_yielded.fetch_add(1, Ordering::Relaxed);
        }
        yields
    }

    /// The deadline the progress thread sleeps to, for the engine's
    /// `timers` and the fault injector's `releases`: while a caller holds
    /// the socket, that caller fires the engine's timers in its polls
    /// (`Device::progress_here`), so they do not wake the thread. A
    /// ping-pong re-arms a probe timer a millisecond ahead with each
    /// message, and the thread would otherwise wake at every deadline
    /// passed over, preempting a spinning program. Once the hold ends
    /// (its timer, at most [`CALLER_HOLD`] after the last poll) the
    /// thread fires them.
    pub fn progress_deadline(
        &self,
        timers: Option<Nanos>,
        releases: Option<Nanos>,
    ) -> Option<Nanos> {
        if self.hold_on.load(Ordering::Acquire) {
            releases
        } else {
            earliest(timers, releases)
        }
    }

    /// The progress thread woke from its sleep.
    pub fn progress_woke(&self) {
        self.rx_coalescing.store(false, Ordering::Relaxed);
    }

    /// Holds callers took (for `roxe stat`).
    pub fn holds_taken(&self) -> u64 {
        self.holds_taken.load(Ordering::Relaxed)
    }

    /// Yields callers spinning on a CQ took (for `roxe stat`).
    pub fn callers_yielded(&self) -> u64 {
        self.callers_yielded.load(Ordering::Relaxed)
    }

    /// Sleeps callers took before receiving (for `roxe stat`).
    pub fn callers_coalesced(&self) -> u64 {
        self.caller_coalesced.load(Ordering::Relaxed)
    }

    /// Whether a caller holds the socket now.
    #[cfg(any(test, feature = "testing"))]
    pub fn hold_on(&self) -> bool {
        self.hold_on.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Nanos = 1_000;
    const MS: Nanos = 1_000_000;

    fn pacer() -> Pacer {
        Pacer::new(PacingConfig::default())
    }

    fn load(queued: usize, unacked: usize, held: bool) -> Load {
        Load {
            queued,
            unacked,
            held,
        }
    }

    /// A bulk burst: 16 packets of 4 KiB ending 2 messages.
    fn bulk() -> Burst {
        Burst {
            bytes: 64 * 1024,
            packets: 16,
            messages: 2,
            last_ends: true,
            read_due: None,
        }
    }

    #[test]
    fn a_busy_progress_thread_yields_only_after_a_pass_without_work() {
        let busy = Pacer::new(PacingConfig {
            busy_poll: true,
            ..PacingConfig::default()
        });
        assert!(busy.busy_pass_yields(false, false));
        assert!(!busy.busy_pass_yields(true, false));
        assert!(!busy.busy_pass_yields(false, true));
        assert!(busy.progress_spins(0), "busy polling always spins");
    }

    #[test]
    fn a_passive_sides_progress_thread_spins_briefly_after_a_burst() {
        let p = pacer();
        assert!(!p.progress_spins(5 * MS), "nothing received yet");
        p.burst(10 * MS, Burst::default());
        assert!(p.progress_spins(10 * MS + 1));
        assert!(p.progress_spins(10 * MS + SPIN_AFTER_BURST - 1));
        assert!(
            !p.progress_spins(10 * MS + SPIN_AFTER_BURST),
            "the burst is past"
        );
        // A program that polls receives for itself: no spin.
        p.polled(10 * MS);
        p.burst(10 * MS + 100, Burst::default());
        assert!(!p.progress_spins(10 * MS + 200));
        // Once it has not polled for PASSIVE_AFTER, the thread spins again.
        p.burst(11 * MS, Burst::default());
        assert!(p.progress_spins(11 * MS + 1));
        // Bulk being coalesced: the thread sleeps out the interval instead.
        p.burst(12 * MS, bulk());
        assert!(!p.progress_spins(12 * MS + 1));
        // Switched off.
        let off = Pacer::new(PacingConfig {
            spin_after_traffic: false,
            ..PacingConfig::default()
        });
        off.burst(10 * MS, Burst::default());
        assert!(!off.progress_spins(10 * MS + 1));
    }

    #[test]
    fn a_spinning_caller_yields_for_the_progress_threads_work_or_a_quiet_peer() {
        let p = pacer();
        let came = |at| p.burst(at, Burst::default());
        // No timer, packets coming: a caller that receives for itself
        // keeps its core.
        came(0);
        assert!(!p.caller_yields(0, CallerReceive::Nothing));
        assert!(!p.caller_yields(0, CallerReceive::Handled));
        assert!(
            p.caller_yields(0, CallerReceive::NotHere),
            "another thread receives"
        );
        p.timers_at(Some(500 * US));
        came(480 * US);
        assert!(!p.caller_yields(499 * US, CallerReceive::Nothing));
        assert!(
            p.caller_yields(500 * US, CallerReceive::Nothing),
            "a timer is due"
        );
        // A pass moved the timer on: nothing is due.
        p.timers_at(Some(900 * US));
        assert!(!p.caller_yields(520 * US, CallerReceive::Nothing));
        // Nothing has come for a while: a peer sharing the core may be
        // waiting for it.
        assert!(!p.caller_yields(480 * US + QUIET_BEFORE_YIELD - 1, CallerReceive::Nothing));
        assert!(p.caller_yields(480 * US + QUIET_BEFORE_YIELD, CallerReceive::Nothing));
        p.timers_at(None);
        came(2_000 * US);
        assert!(!p.caller_yields(2_010 * US, CallerReceive::Nothing));
        assert_eq!(p.callers_yielded(), 3);
    }

    #[test]
    fn a_single_post_is_ack_clocked_a_list_never() {
        let p = pacer();
        assert!(p.verb_pass(Verb::SinglePost, || load(0, 0, false)));
        assert!(!p.verb_pass(Verb::PostList, || load(100, 100, false)));
        assert!(!p.verb_pass(Verb::Other, || load(100, 100, false)));
        let off = Pacer::new(PacingConfig {
            ack_clocked: false,
            ..PacingConfig::default()
        });
        assert!(!off.verb_pass(Verb::SinglePost, || load(0, 0, false)));
    }

    #[test]
    fn a_poll_is_ack_clocked_only_in_a_stream_of_single_posts() {
        let p = pacer();
        assert!(!p.verb_pass(Verb::Poll, || load(POLL_CLOCKED_QUEUE - 1, 0, false)));
        assert!(p.verb_pass(Verb::Poll, || load(POLL_CLOCKED_QUEUE, 0, false)));
    }

    #[test]
    fn held_messages_go_to_a_caller_that_polled_within_the_window() {
        let p = pacer();
        p.polled(1_000 * US);
        // 10 µs after the poll: the ACK's pass leaves them to the caller.
        assert!(p.progress_pass(1_010 * US, || load(10, 40, true)));
        assert!(p.progress_pass_done(true, || load(10, 40, true)));
        // The caller's next poll sends them, unclocked (once).
        assert!(!p.verb_pass(Verb::Poll, || load(10, 40, true)));
        assert!(p.verb_pass(Verb::Poll, || load(10, 40, true)));
        // 30 µs after the last poll: the progress thread sends them itself.
        assert!(!p.progress_pass(1_040 * US, || load(10, 40, true)));
        // Nothing held: nothing to leave.
        assert!(!p.progress_pass(1_001 * US, || load(10, 40, false)));
        assert!(!p.progress_pass_done(false, || load(10, 40, true)));
        // A caller about to sleep on a channel gets nothing left to it, and
        // what was left wakes the progress thread to send it now.
        p.polled(2_000 * US);
        assert!(p.progress_pass(2_005 * US, || load(10, 40, true)));
        assert!(p.progress_pass_done(true, || load(10, 40, true)));
        assert!(p.caller_sleeps(), "the thread is woken for what it left");
        assert!(!p.progress_pass(2_006 * US, || load(10, 40, true)));
    }

    #[test]
    fn having_left_messages_the_progress_thread_sleeps_briefly() {
        let p = pacer();
        let s = p.progress_sleep(0, None, true);
        assert_eq!(s.duration, HANDOVER_FALLBACK);
        assert!(s.watch_socket);
        let s = p.progress_sleep(0, Some(5 * US), false);
        assert_eq!(s.duration, Duration::from_micros(5));
        assert_eq!(p.progress_sleep(0, None, false).duration, MAX_SLEEP);
    }

    #[test]
    fn a_caller_holds_the_socket_while_it_spins_or_a_stream_flows() {
        let p = pacer();
        // Nothing flows and polls come far apart: no hold.
        assert_eq!(p.empty_poll(US).arm_hold, None);
        assert_eq!(p.empty_poll(US + SPINNING_POLL_GAP).arm_hold, None);
        // Polls closer together spin: the caller holds.
        assert!(p.empty_poll(2 * US + SPINNING_POLL_GAP).arm_hold.is_some());
        assert!(p.end_hold() || !p.hold_on());
        // A burst ending 8 messages: a stream comes in, and a poll holds
        // however long since the last.
        p.burst(
            0,
            Burst {
                bytes: 8 * 64,
                packets: 8,
                messages: STREAM_BURST,
                last_ends: true,
                read_due: None,
            },
        );
        let e = p.empty_poll(MS);
        assert_eq!(e.arm_hold, Some(Duration::from_nanos(MIN_CALLER_HOLD)));
        p.hold_armed(MS);
        assert!(p.hold_on() && !p.progress_receives());
        assert_eq!(p.holds_taken(), 1);
        // Re-armed once half the hold has passed, however many polls came
        // meanwhile (3 µs apart, UCX's): the hold never lapses, and each
        // re-arm doubles it, up to `CALLER_HOLD`, so the timer is
        // reprogrammed ever more rarely.
        let mut lens = Vec::new();
        let mut now = MS;
        while now < 30 * MS {
            now += 3 * US;
            if let Some(len) = p.empty_poll(now).arm_hold {
                let since = now - p.hold_armed_at.load(Ordering::Relaxed);
                assert!(since >= lens.last().copied().unwrap_or(MIN_CALLER_HOLD) / 2);
                lens.push(len.as_nanos() as Nanos);
                p.hold_armed(now);
            }
        }
        let want: Vec<Nanos> = (1..=5).map(|k| MIN_CALLER_HOLD << k).collect();
        assert_eq!(lens[..5], want[..]);
        assert!(lens[5..].iter().all(|&l| l == CALLER_HOLD), "{lens:?}");
        assert_eq!(p.holds_taken(), 1);
        // The timer fired: the socket is the progress thread's. Nothing
        // waited: the next hold is as long.
        p.hold_expired();
        assert!(p.progress_receives());
        assert_eq!(p.hold_len(), CALLER_HOLD);
        // A caller preempted between arming the timer and taking the hold
        // may take it after the timer fired: it ends the hold itself.
        p.hold_armed(40 * MS);
        assert!(!p.hold_outlived(40 * MS, 40 * MS + CALLER_HOLD - 1));
        assert!(p.hold_outlived(40 * MS, 40 * MS + CALLER_HOLD));
        assert!(p.end_hold());
        assert!(p.progress_receives());
        // A hold that ended with datagrams waiting: the next starts short.
        p.hold_stranded();
        assert_eq!(
            p.empty_poll(50 * MS).arm_hold,
            Some(Duration::from_nanos(MIN_CALLER_HOLD))
        );
        // While held, the progress thread sleeps without the socket, and
        // past the engine's timers, which the holder fires; the fault
        // injector's releases still wake it.
        assert_eq!(p.progress_deadline(Some(7), Some(9)), Some(7));
        p.hold_armed(2_000 * US);
        assert!(!p.progress_sleep(10, None, false).watch_socket);
        assert_eq!(p.progress_deadline(Some(7), None), None);
        assert_eq!(p.progress_deadline(Some(7), Some(9)), Some(9));
        assert!(p.caller_sleeps(), "arming a notification ends the hold");
        assert!(p.progress_receives());
        assert_eq!(p.progress_deadline(Some(7), None), Some(7));
    }

    #[test]
    fn post_lists_of_small_messages_make_a_stream_out_until_they_complete() {
        let p = pacer();
        p.verb_done(Verb::PostList, || load(STREAM_SEND_QUEUE, 16, false));
        assert!(p.empty_poll(0).arm_hold.is_some());
        // Large messages (many packets each) are no such stream.
        p.verb_done(Verb::PostList, || load(STREAM_SEND_QUEUE, 1000, false));
        assert!(p.empty_poll(MS).arm_hold.is_none());
        p.verb_done(Verb::PostList, || load(STREAM_SEND_QUEUE, 16, false));
        // A pass finding the messages done ends it.
        p.pass_done(|| load(2, 2, false));
        assert!(p.empty_poll(2 * MS).arm_hold.is_none());
    }

    #[test]
    fn a_single_post_waiting_for_an_ack_leaves_the_hold_standing() {
        let p = pacer();
        p.verb_done(Verb::PostList, || load(STREAM_SEND_QUEUE, 16, false));
        p.hold_armed(0);
        // The caller's next poll receives the ACK: no wake-up, no re-arm.
        p.verb_done(Verb::SinglePost, || load(20, 30, true));
        assert!(p.hold_on());
    }

    #[test]
    fn with_caller_progress_off_no_caller_receives_or_holds() {
        let p = Pacer::new(PacingConfig {
            caller_progress: false,
            ..PacingConfig::default()
        });
        p.burst(0, bulk());
        p.burst(1, bulk());
        let e = p.empty_poll(2);
        assert!(!e.receive && e.arm_hold.is_none() && e.sleep.is_none());
    }

    #[test]
    fn a_bulk_burst_makes_the_progress_thread_coalesce_once() {
        let p = pacer();
        p.burst(0, bulk());
        let s = p.progress_sleep(0, None, false);
        assert!(s.coalescing && !s.watch_socket);
        assert_eq!(s.duration, Duration::from_micros(20));
        p.progress_woke();
        // The next sleep, without a new bulk burst, is an ordinary one.
        assert!(!p.progress_sleep(0, None, false).coalescing);
        // Not when a timer is due sooner than the interval.
        p.burst(0, bulk());
        assert!(!p.progress_sleep(0, Some(5 * US), false).coalescing);
    }

    #[test]
    fn small_messages_and_one_whole_message_are_not_bulk() {
        let p = pacer();
        // A stream of 64-byte messages.
        p.burst(
            0,
            Burst {
                bytes: 64 * 1024,
                packets: 1024,
                messages: 1024,
                last_ends: true,
                read_due: None,
            },
        );
        assert!(!p.progress_sleep(0, None, false).coalescing);
        // One 64 KiB message, whole (a ping-pong's).
        p.burst(
            0,
            Burst {
                bytes: 64 * 1024,
                packets: 16,
                messages: 1,
                last_ends: true,
                read_due: None,
            },
        );
        assert!(!p.progress_sleep(0, None, false).coalescing);
        // The same message cut over two bursts is bulk (it stops inside).
        p.burst(
            0,
            Burst {
                bytes: 32 * 1024,
                packets: 8,
                messages: 0,
                last_ends: false,
                read_due: None,
            },
        );
        assert!(p.progress_sleep(0, None, false).coalescing);
    }

    #[test]
    fn a_notification_armed_cancels_a_coalescing_sleep() {
        let p = pacer();
        p.burst(0, bulk());
        // The caller arms before the thread looks: no coalescing.
        assert!(!p.caller_sleeps());
        assert!(!p.progress_sleep(0, None, false).coalescing);
        // The thread is coalescing when the caller arms: wake it.
        p.burst(0, bulk());
        assert!(p.progress_sleep(0, None, false).coalescing);
        assert!(p.caller_sleeps());
        p.progress_woke();
        assert!(!p.caller_sleeps());
    }

    #[test]
    fn after_two_bulk_bursts_in_a_row_a_polling_caller_sleeps_the_interval_out() {
        let p = pacer();
        p.burst(1_000 * US, bulk());
        assert_eq!(
            p.empty_poll(1_001 * US).sleep,
            None,
            "one burst is no stream"
        );
        p.burst(1_010 * US, bulk());
        assert_eq!(
            p.empty_poll(1_015 * US).sleep,
            Some(Duration::from_micros(15))
        );
        assert_eq!(p.callers_coalesced(), 1);
        // The interval is over: receive at once.
        assert_eq!(p.empty_poll(1_031 * US).sleep, None);
        // A burst that is not bulk ends the run.
        p.burst(1_040 * US, Burst::default());
        assert_eq!(p.empty_poll(1_041 * US).sleep, None);
        let off = Pacer::new(PacingConfig {
            rx_coalesce: Duration::ZERO,
            ..PacingConfig::default()
        });
        off.burst(0, bulk());
        off.burst(1, bulk());
        assert_eq!(off.empty_poll(2).sleep, None);
        assert!(!off.progress_sleep(2, None, false).coalescing);
    }

    #[test]
    fn the_last_bursts_of_a_read_are_not_slept_for() {
        let p = pacer();
        let reads = |due| Burst {
            read_due: Some(due),
            ..bulk()
        };
        // A long READ's responses: a stream like any other, until three
        // bursts' worth remain.
        p.burst(1_000 * US, reads(1 << 20));
        p.burst(1_010 * US, reads(3 * 64 * 1024));
        assert_eq!(
            p.empty_poll(1_015 * US).sleep,
            Some(Duration::from_micros(15))
        );
        assert!(p.progress_sleep(1_015 * US, None, false).coalescing);
        // What the READs still owe comes in two more bursts as large: the
        // caller receives them at once, and the progress thread does not
        // coalesce.
        p.burst(1_020 * US, reads(128 * 1024));
        assert_eq!(p.empty_poll(1_021 * US).sleep, None);
        assert!(!p.progress_sleep(1_021 * US, None, false).coalescing);
        // Not READ responses only: the device's READs say nothing of it.
        p.burst(1_030 * US, bulk());
        p.burst(1_040 * US, bulk());
        assert!(p.empty_poll(1_041 * US).sleep.is_some());
    }

    #[test]
    fn the_environment_sets_every_knob_and_names_a_bad_value() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(name, _)| *name == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c = PacingConfig::from_lookup(env(&[])).unwrap();
        assert_eq!(c, PacingConfig::default());
        let c = PacingConfig::from_lookup(env(&[
            ("ROXE_BUSY_POLL", "on"),
            ("ROXE_GSO", "off"),
            ("ROXE_CALLER_PROGRESS", "no"),
            ("ROXE_CALLER_HOLD", "0"),
            ("ROXE_ACK_CLOCKED", "false"),
            ("ROXE_TX_BY_REF", "off"),
            ("ROXE_RX_COALESCE_US", "50"),
            ("ROXE_PROGRESS_SPIN", "off"),
        ]))
        .unwrap();
        assert!(!c.spin_after_traffic);
        assert!(c.busy_poll && !c.gso && !c.caller_progress && !c.caller_hold);
        assert!(!c.ack_clocked && !c.payload_by_ref);
        assert_eq!(c.rx_coalesce, Duration::from_micros(50));
        let e = PacingConfig::from_lookup(env(&[("ROXE_GSO", "maybe")])).unwrap_err();
        assert!(e.to_string().contains("ROXE_GSO"), "{e}");
        let e = PacingConfig::from_lookup(env(&[("ROXE_RX_COALESCE_US", "1001")])).unwrap_err();
        assert!(e.to_string().contains("ROXE_RX_COALESCE_US"), "{e}");
    }
}
