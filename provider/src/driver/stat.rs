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
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => Path::new(&d).join("roxe"),
        None => PathBuf::from(format!("/tmp/roxe-{uid}")),
    };
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
