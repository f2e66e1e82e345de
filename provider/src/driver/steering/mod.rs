//! Many processes on one address: every process of a user on a host can
//! open a device on the host's address, as with rxe, with no daemon.
//!
//! Each process binds its own socket to `addr:4791` with `SO_REUSEPORT`,
//! takes a slot of the QPN space (QPN bits 16..23, see [`registry`]), and
//! the kernel steers each datagram to the process that owns it with a
//! classic BPF program attached to the port's reuseport group
//! (`SO_ATTACH_REUSEPORT_CBPF`, which needs no privilege; see
//! [`program`]). The program maps slots to the *socket indexes* of the
//! group, which the kernel renumbers when a socket closes (the last one
//! takes the closed one's place). Rather than predict that numbering
//! (impossible when several processes are killed at once), the process
//! that changes the group asks it: it sends one probe per index to the
//! address, the program steers probe `k` to socket `k`, and the process
//! holding it answers with its slot ([`SharedAddress::reconcile`]). It
//! does so when it joins, when it listens, and whenever its receive path
//! meets a packet that belongs to another slot (a sign that the group
//! changed under the program: a process ended without leaving).
//!
//! Failure modes, each repaired or bounded:
//! - a process killed: its QPNs' packets fall to the kernel's hash choice
//!   and are dropped by whoever receives them (`rx_misrouted`); the first
//!   such packet for a live slot makes that receiver probe again;
//! - a process that receives nothing (stopped): probes for its index go
//!   unanswered and the program leaves it out until it answers;
//! - the kernel steers a GSO datagram as one: a roxe sender's GSO send
//!   carries packets for one slot only (the batch cuts runs at slot
//!   changes). A NIC's GRO may still merge datagrams of one flow (one
//!   source port) for two processes into one, which reaches the first's
//!   process: the packets of the other slot are dropped there (counted)
//!   and resent by their sender. Loopback has no GRO.

pub(crate) mod program;
mod registry;

use program::{Route, Table, PROBE_INDEX_AT, PROBE_OPCODE};
use registry::{Registry, SlotHold};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant};

/// A probe's tag, after its index and nonce.
const PROBE_MAGIC: &[u8; 4] = b"RXPB";
/// A probe: BTH, DETH, then index (2), 2 reserved, nonce (8), magic (4),
/// and the ICRC.
const PROBE_LEN: usize = PROBE_INDEX_AT + 16 + roxe_wire::ICRC_LEN;
/// The first byte of an answer to a probe.
const ANSWER_OPCODE: u8 = 0xC1;
/// An answer: opcode, slot, index (2), nonce (8), magic (4).
const ANSWER_LEN: usize = 16;
/// How long a probe round waits for answers, and how many rounds.
const PROBE_WAIT: Duration = Duration::from_millis(25);
const PROBE_ROUNDS: u32 = 4;
/// Reconciling at most this often on misrouted packets.
const RECONCILE_EVERY: Duration = Duration::from_millis(50);

/// This process's share of a shared address.
pub(crate) struct SharedAddress {
    addr: IpAddr,
    registry: Registry,
    hold: SlotHold,
    /// Asks the reconciling thread for a round.
    nudge: SyncSender<()>,
    /// Packets for other slots that reached this process (dropped).
    misrouted: AtomicU64,
    /// Probe rounds run.
    reconciles: AtomicU64,
    /// A misrouted packet asked for a probe round.
    probe_wanted: std::sync::atomic::AtomicBool,
    /// The CM service IDs this process holds in the registry.
    claims: parking_lot::Mutex<std::collections::HashMap<u64, Claim>>,
}

/// A CM service ID held: by how many listeners, and since when by none.
#[derive(Debug)]
struct Claim {
    listeners: u32,
    idle_since: Option<Instant>,
}

/// How long a service ID nobody listens on stays this process's.
const CLAIM_LINGER: Duration = Duration::from_millis(100);

impl std::fmt::Debug for SharedAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedAddress")
            .field("addr", &self.addr)
            .field("slot", &self.hold.slot)
            .finish_non_exhaustive()
    }
}

/// `setsockopt(SO_ATTACH_REUSEPORT_CBPF)`.
fn attach(socket: &UdpSocket, prog: &[libc::sock_filter]) -> io::Result<()> {
    const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len())
            .map_err(|_| io::Error::other("steering program too long"))?,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: the socket is open; `fprog` points at `prog`, which lives
    // for the call, with its exact length; the kernel copies it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Probe `index`, sent from `from` to `to`: a well-formed RoCEv2 UD SEND
/// to QP0 (so that captures of the address stay valid), ICRC included.
fn probe(index: u16, nonce: u64, from: SocketAddr, to: SocketAddr) -> io::Result<Vec<u8>> {
    let mut p = vec![0u8; PROBE_LEN];
    p[0] = PROBE_OPCODE;
    p[2..4].copy_from_slice(&0xFFFFu16.to_be_bytes()); // default P_Key
    let at = PROBE_INDEX_AT;
    p[at..at + 2].copy_from_slice(&index.to_be_bytes());
    p[at + 4..at + 12].copy_from_slice(&nonce.to_be_bytes());
    p[at + 12..at + 16].copy_from_slice(PROBE_MAGIC);
    let body = &p[..PROBE_LEN - roxe_wire::ICRC_LEN];
    let icrc = match (from, to) {
        (SocketAddr::V4(f), SocketAddr::V4(t)) => {
            roxe_wire::icrc::compute_linux_ipv4(*f.ip(), *t.ip(), f.port(), t.port(), body)
        }
        (SocketAddr::V6(f), SocketAddr::V6(t)) => {
            roxe_wire::icrc::compute_ipv6(*f.ip(), *t.ip(), f.port(), t.port(), body)
        }
        _ => return Err(io::Error::other("a probe between address families")),
    }
    .map_err(|e| io::Error::other(format!("a probe's ICRC: {e}")))?;
    p[PROBE_LEN - roxe_wire::ICRC_LEN..].copy_from_slice(&roxe_wire::icrc::to_wire(icrc));
    Ok(p)
}

/// The answer to probe `p` from the process in `slot`, if `p` is a probe.
pub(crate) fn answer(p: &[u8], slot: u8) -> Option<[u8; ANSWER_LEN]> {
    let at = PROBE_INDEX_AT;
    if p.len() != PROBE_LEN || p[0] != PROBE_OPCODE || &p[at + 12..at + 16] != PROBE_MAGIC {
        return None;
    }
    let mut a = [0u8; ANSWER_LEN];
    a[0] = ANSWER_OPCODE;
    a[1] = slot;
    a[2..4].copy_from_slice(&p[at..at + 2]);
    a[4..12].copy_from_slice(&p[at + 4..at + 12]);
    a[12..].copy_from_slice(PROBE_MAGIC);
    Some(a)
}

/// A parsed answer: (index, slot), if it answers probes tagged `nonce`.
fn parse_answer(a: &[u8], nonce: u64) -> Option<(u32, u8)> {
    if a.len() != ANSWER_LEN || a[0] != ANSWER_OPCODE || &a[12..] != PROBE_MAGIC {
        return None;
    }
    (a[4..12] == nonce.to_be_bytes()).then(|| (u32::from(u16::from_be_bytes([a[2], a[3]])), a[1]))
}

impl SharedAddress {
    /// Join `addr`'s group: take a slot and bind a socket to
    /// `addr:port` beside the other processes'. Call [`reconcile`]
    /// (Self::reconcile) once the socket is received from.
    pub(crate) fn join(
        addr: IpAddr,
        port: u16,
    ) -> io::Result<(SharedAddress, UdpSocket, Receiver<()>)> {
        let registry = Registry::open(addr)?;
        let mut locked = registry.lock()?;
        locked.prune(None);
        let hold = locked.claim(std::process::id())?;
        let socket = super::socket::bind_reuseport(addr, port).map_err(|e| {
            if e.kind() == io::ErrorKind::AddrInUse {
                io::Error::new(
                    e.kind(),
                    format!(
                        "binding {}: {e}: held by a program that does not share it (another \
                         user's process, or a device opened with ROXE_SHARE=off)",
                        SocketAddr::new(addr, port)
                    ),
                )
            } else {
                io::Error::new(
                    e.kind(),
                    format!("binding {}: {e}", SocketAddr::new(addr, port)),
                )
            }
        })?;
        // Until probed, the program steers to the members already known.
        attach(&socket, &table_of(&locked.state).program())?;
        locked.save()?;
        drop(locked);
        let (nudge, nudged) = sync_channel(1);
        let shared = SharedAddress {
            addr,
            registry,
            hold,
            nudge,
            misrouted: AtomicU64::new(0),
            reconciles: AtomicU64::new(0),
            probe_wanted: std::sync::atomic::AtomicBool::new(false),
            claims: Default::default(),
        };
        Ok((shared, socket, nudged))
    }

    /// This process's slot.
    pub(crate) fn slot(&self) -> u8 {
        self.hold.slot
    }

    /// Packets of other slots that reached this process and were dropped.
    pub(crate) fn misrouted(&self) -> u64 {
        self.misrouted.load(Ordering::Relaxed)
    }

    /// Probe rounds run by this process.
    pub(crate) fn probe_rounds(&self) -> u64 {
        self.reconciles.load(Ordering::Relaxed)
    }

    /// Whether the receive path should pass `p` (UDP payload) to the
    /// engine: false for probes (answered through `reply`) and for
    /// packets of other slots (counted; the group is probed again).
    /// `listens` says whether this process listens on a service ID.
    pub(crate) fn admit(
        &self,
        p: &[u8],
        listens: impl Fn(u64) -> bool,
        reply: impl FnOnce(&[u8]),
    ) -> bool {
        let own = self.hold.slot;
        match Table::route_with(p, |sid| listens(sid).then_some(own)) {
            Route::Slot(s) if s == own => true,
            Route::Any => true,
            Route::Index(_) => {
                if let Some(a) = answer(p, own) {
                    reply(&a);
                }
                false
            }
            Route::Slot(_) => {
                self.misrouted.fetch_add(1, Ordering::Relaxed);
                self.probe_wanted.store(true, Ordering::Release);
                // Full: a round is already asked for.
                let _: Result<(), TrySendError<()>> = self.nudge.try_send(());
                false
            }
        }
    }

    /// Ask the group which process holds each socket index, and attach
    /// the program that steers by the answers.
    pub(crate) fn reconcile(&self, group: &UdpSocket) -> io::Result<()> {
        // The registry is not held while the group answers (a member
        // may be slow, or stopped): members read, probes, then the
        // answers written for the members probed.
        let probed: Vec<u8> = {
            let mut locked = self.registry.lock()?;
            if !locked.prune(Some(self.hold.slot)).is_empty() {
                locked.save()?;
            }
            locked.state.members.keys().copied().collect()
        };
        let found = self.probe(probed.len())?;
        let mut locked = self.registry.lock()?;
        locked.prune(Some(self.hold.slot));
        for (slot, m) in locked.state.members.iter_mut() {
            // A member that joined meanwhile probes for itself.
            if probed.contains(slot) {
                m.index = found
                    .iter()
                    .position(|f| *f == Some(*slot))
                    .map(|i| i as u32);
            }
        }
        attach(group, &table_of(&locked.state).program())?;
        locked.save()?;
        self.reconciles.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(addr = %self.addr, slot = self.hold.slot, ?found, "shared address probed");
        Ok(())
    }

    /// Which slot holds each of the group's first `members` socket
    /// indexes, as far as the group answers within the probe rounds.
    fn probe(&self, members: usize) -> io::Result<Vec<Option<u8>>> {
        // Alone: the group is this socket (index 0), unless a process
        // just killed has not closed its socket yet, which a misrouted
        // packet will tell.
        let mut found: Vec<Option<u8>> = vec![None; members];
        if members == 1 {
            found[0] = Some(self.hold.slot);
            return Ok(found);
        }
        // Don't-fragment, as the device's sockets: IPv4 identification 0,
        // which the probes' ICRCs are computed for.
        let asker = super::socket::bind(self.addr, 0)?;
        asker.set_nonblocking(false)?;
        let from = asker.local_addr()?;
        // The engine's source of keys: the OS's randomness.
        let tag = crate::engine::random_key() as u64;
        let to = SocketAddr::new(self.addr, roxe_wire::ROCEV2_PORT);
        let mut buf = [0u8; 64];
        for round in 0..PROBE_ROUNDS {
            for (k, _) in found.iter().enumerate().filter(|(_, f)| f.is_none()) {
                asker.send_to(&probe(k as u16, tag, from, to)?, to)?;
            }
            let deadline = Instant::now() + PROBE_WAIT * (round + 1);
            while found.iter().any(Option::is_none) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                asker.set_read_timeout(Some(left))?;
                let Ok((n, _)) = asker.recv_from(&mut buf) else {
                    break;
                };
                if let Some((index, slot)) = parse_answer(&buf[..n], tag) {
                    if let Some(f) = found.get_mut(index as usize) {
                        *f = Some(slot);
                    }
                }
            }
            if found.iter().all(Option::is_some) {
                break;
            }
        }
        Ok(found)
    }

    /// Listen on `service_id`: EADDRINUSE if another live process of the
    /// address does; else recorded, and the program steers its REQs here.
    /// A service this process listened on a moment ago is still its own
    /// (see [`unlisten`](Self::unlisten)): no registry round trip.
    pub(crate) fn listen(&self, group: &UdpSocket, service_id: u64) -> io::Result<()> {
        let mut claims = self.claims.lock();
        if let Some(c) = claims.get_mut(&service_id) {
            c.listeners += 1;
            return Ok(());
        }
        let mut locked = self.registry.lock()?;
        locked.prune(Some(self.hold.slot));
        match locked.state.services.get(&service_id) {
            Some(&s) if s != self.hold.slot => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "service ID {service_id:#x} of {} has a listener in another process",
                        self.addr
                    ),
                ))
            }
            _ => {}
        }
        locked.state.services.insert(service_id, self.hold.slot);
        attach(group, &table_of(&locked.state).program())?;
        locked.save()?;
        claims.insert(
            service_id,
            Claim {
                listeners: 1,
                idle_since: None,
            },
        );
        Ok(())
    }

    /// A listener on `service_id` is gone. The service stays this
    /// process's for [`CLAIM_LINGER`] (programs such as perftest's close
    /// a listener and listen again at once; a REQ between the two is
    /// answered here, as the kernel's rdma_cm would answer it), then the
    /// reconciling thread gives it back.
    pub(crate) fn unlisten(&self, service_id: u64) {
        let mut claims = self.claims.lock();
        if let Some(c) = claims.get_mut(&service_id) {
            c.listeners = c.listeners.saturating_sub(1);
            if c.listeners == 0 {
                c.idle_since = Some(Instant::now());
            }
        }
    }

    /// Give back the services idle for [`CLAIM_LINGER`].
    fn release_idle(&self, group: &UdpSocket) -> io::Result<()> {
        let mut claims = self.claims.lock();
        let idle: Vec<u64> = claims
            .iter()
            .filter(|(_, c)| {
                c.listeners == 0 && c.idle_since.is_some_and(|t| t.elapsed() >= CLAIM_LINGER)
            })
            .map(|(&sid, _)| sid)
            .collect();
        if idle.is_empty() {
            return Ok(());
        }
        let mut locked = self.registry.lock()?;
        for sid in &idle {
            claims.remove(sid);
            if locked.state.services.get(sid) == Some(&self.hold.slot) {
                locked.state.services.remove(sid);
            }
        }
        attach(group, &table_of(&locked.state).program())?;
        locked.save()
    }

    /// Leave the group: forget this slot and steer as the group will be
    /// once the socket closes (the last socket takes its index), then
    /// close it through `close`, all under the registry lock.
    pub(crate) fn leave(&self, group: &UdpSocket, close: impl FnOnce()) {
        let Ok(mut locked) = self.registry.lock() else {
            close();
            return;
        };
        let own = self.hold.slot;
        let mine = locked.state.members.get(&own).and_then(|m| m.index);
        locked.state.remove(own);
        let last = locked.state.members.len() as u32;
        if let Some(mine) = mine {
            for m in locked.state.members.values_mut() {
                if m.index == Some(last) {
                    m.index = Some(mine);
                }
            }
        }
        let _ = attach(group, &table_of(&locked.state).program());
        let _ = locked.save();
        close();
        drop(locked);
    }

    /// Wake the reconciling thread (to see that the device stops).
    pub(crate) fn wake(&self) {
        let _ = self.nudge.try_send(());
    }

    /// Run the reconciling thread's loop until `nudged` disconnects.
    pub(crate) fn serve(&self, group: &UdpSocket, nudged: Receiver<()>, stop: impl Fn() -> bool) {
        let mut last = Instant::now() - RECONCILE_EVERY;
        while !stop() {
            match nudged.recv_timeout(CLAIM_LINGER) {
                Ok(()) if self.probe_wanted.swap(false, Ordering::AcqRel) => {
                    if stop() {
                        return;
                    }
                    let wait = RECONCILE_EVERY.saturating_sub(last.elapsed());
                    std::thread::sleep(wait);
                    if stop() {
                        return;
                    }
                    if let Err(e) = self.reconcile(group) {
                        tracing::warn!(addr = %self.addr, error = %e, "probing the shared address failed");
                    }
                    last = Instant::now();
                    // Misrouted packets that arrived meanwhile asked for
                    // this same round.
                    while nudged.try_recv().is_ok() {}
                }
                Ok(()) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            }
            if let Err(e) = self.release_idle(group) {
                tracing::warn!(addr = %self.addr, error = %e, "giving back CM service IDs failed");
            }
        }
    }
}

/// The program's table from the registry's state.
fn table_of(state: &registry::State) -> Table {
    Table {
        indexes: state
            .members
            .iter()
            .filter_map(|(&slot, m)| m.index.map(|i| (slot, i)))
            .collect(),
        services: state
            .services
            .iter()
            .map(|(&sid, &slot)| (sid, slot))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_is_a_valid_rocev2_packet_answered_with_the_slot_and_its_nonce() {
        let (from, to) = (
            "127.0.0.9:40000".parse().unwrap(),
            "127.0.0.9:4791".parse().unwrap(),
        );
        let p = probe(3, 0x1122_3344_5566_7788, from, to).unwrap();
        let (SocketAddr::V4(f), SocketAddr::V4(t)) = (from, to) else {
            unreachable!()
        };
        let body = &p[..PROBE_LEN - 4];
        let icrc = roxe_wire::icrc::compute_linux_ipv4(*f.ip(), *t.ip(), f.port(), t.port(), body)
            .unwrap();
        assert_eq!(roxe_wire::icrc::from_wire(&p).unwrap(), icrc);
        let parsed = roxe_wire::PacketRepr::parse_bytes(&p);
        assert!(parsed.is_ok(), "{parsed:?}");
        let a = answer(&p, 42).unwrap();
        assert_eq!(parse_answer(&a, 0x1122_3344_5566_7788), Some((3, 42)));
        assert_eq!(
            parse_answer(&a, 0x1122_3344_5566_7789),
            None,
            "another round's nonce"
        );
        assert!(answer(&p[..PROBE_LEN - 1], 42).is_none());
        let mut data = p.clone();
        data[0] = 0x0a;
        assert!(answer(&data, 42).is_none());
    }
}
