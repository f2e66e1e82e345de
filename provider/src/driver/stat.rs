//! What `roxe stat` reads from running devices: each device answers on a
//! Unix socket of its own, `<dir>/<pid>-<address>.sock`, where `<dir>` is
//! `$XDG_RUNTIME_DIR/roxe` or `/tmp/roxe-<uid>`, a directory of this user
//! with mode 0700 (another user can neither list nor connect). A connection
//! gets one text answer and is closed:
//!
//! ```text
//! device pid=1234 addr=127.0.0.1 rx_packets=10 tx_packets=12 ...
//! qp qpn=17 type=RC state=RTS peer=127.0.0.2 dest_qpn=17 next_psn=... ...
//! ```
//!
//! The socket is removed when the device closes; the files of processes
//! that died without closing are removed by the next device that opens
//! and by `roxe stat`. Everything here is best effort: a device whose
//! socket cannot be made still opens (the reason is logged).

use super::shared::Core;
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

/// The per-user directory of the stat sockets, created (mode 0700) if
/// missing. Refused when it exists but belongs to another user or others
/// may enter it.
pub fn stat_dir() -> io::Result<PathBuf> {
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => Path::new(&d).join("roxe"),
        None => PathBuf::from(format!("/tmp/roxe-{}", uid())),
    };
    private_dir(dir)
}

/// This process's user.
pub(crate) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// `dir`, created (mode 0700) if missing; refused when it exists but
/// belongs to another user or others may enter it.
pub(crate) fn private_dir(dir: PathBuf) -> io::Result<PathBuf> {
    let uid = uid();
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a directory of user {uid} with mode 0700",
                dir.display()
            ),
        ));
    }
    Ok(dir)
}

/// The process id in a socket file name (`<pid>-<address>.sock`).
pub fn pid_of(name: &str) -> Option<u32> {
    name.strip_suffix(".sock")?.split_once('-')?.0.parse().ok()
}

/// Remove the sockets of processes that no longer run.
pub fn remove_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = pid_of(&name) {
            if !Path::new("/proc").join(pid.to_string()).exists() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// A device's stat socket.
pub(crate) struct StatServer {
    listener: UnixListener,
    path: PathBuf,
}

impl StatServer {
    /// Listen for `roxe stat` at this device's path.
    pub(crate) fn open(addr: IpAddr) -> io::Result<StatServer> {
        let dir = stat_dir()?;
        remove_stale(&dir);
        let name = format!("{}-{}.sock", std::process::id(), addr).replace(':', "_");
        let path = dir.join(name);
        // A file left by an earlier device of this process at this address.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        Ok(StatServer { listener, path })
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Answer every waiting connection with `answer` (never blocks: a
    /// reader that does not read loses its answer).
    pub(crate) fn serve(&self, answer: impl Fn() -> String) {
        while let Ok((mut conn, _)) = self.listener.accept() {
            let _ = conn.set_nonblocking(true);
            let _ = conn.write_all(answer().as_bytes());
        }
    }
}

impl Drop for StatServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl super::shared::Shared {
    /// The answer to `roxe stat` (see `stat.rs`): the device's counters,
    /// then one line per QP.
    pub(super) fn stat_answer(&self, core: &Core) -> String {
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
             tx_left_to_caller={} drops={} slot={} rx_misrouted={} steering_probes={} probes={} \
             rx_in_pass={} rx_placed_early={} caller_yields={} caller_timers={} holds_stranded={}",
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
            self.pacer.holds_taken(),
            d.rx_coalesced,
            self.pacer.callers_coalesced(),
            d.tx_left_to_caller,
            drops_field(&e.drops),
            self.steering.as_ref().map_or(0, |s| s.slot()),
            self.steering.as_ref().map_or(0, |s| s.misrouted()),
            self.steering.as_ref().map_or(0, |s| s.probe_rounds()),
            e.probes,
            d.rx_in_pass,
            e.rx_placed_early,
            self.pacer.callers_yielded(),
            d.caller_timers,
            d.holds_stranded,
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
                 rnr_naks_received={} probes={} fast_retransmits={} holes_reported={} holes_resent={} \
                 acks_held={} holds_missed={} srtt_us={} loss_window={} drops={}",
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
                q.counters.probes,
                q.counters.fast_retransmits,
                q.counters.holes_reported,
                q.counters.holes_resent,
                q.counters.acks_held,
                q.counters.holds_missed,
                q.srtt_ns
                    .map_or("-".to_string(), |n| format!("{:.1}", n as f64 / 1000.0)),
                q.loss_window.map_or("-".to_string(), |w| w.to_string()),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_carry_the_pid() {
        assert_eq!(pid_of("1234-127.0.0.1.sock"), Some(1234));
        assert_eq!(pid_of("99-__1.sock"), Some(99));
        assert_eq!(pid_of("x-127.0.0.1.sock"), None);
        assert_eq!(pid_of("1234-127.0.0.1"), None);
    }
}
