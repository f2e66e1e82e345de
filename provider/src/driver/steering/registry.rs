//! The per-host registry of a shared address: which processes (slots) hold
//! it, which socket index each one's socket has in the reuseport group,
//! and which slot listens on each CM service ID.
//!
//! One text file per address and network namespace in
//! `/tmp/roxe-<uid>/shared` (mode 0700 and owned by the user: anything
//! else is refused), read and rewritten under
//! `flock(2)`. Each member also holds an exclusive `flock` on a file of
//! its slot for as long as it lives: the kernel drops it when the process
//! ends, however it ends, so a member whose slot file can be locked by
//! another is gone.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The highest slot: QPN bits 16..23. Slot 0 is the QPNs below 0x10000,
/// which a process alone on its address uses.
pub(crate) const MAX_SLOT: u8 = 255;

/// One process on the address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member {
    pub pid: u32,
    /// Its socket's index in the reuseport group, as last probed.
    pub index: Option<u32>,
}

/// The registry's contents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct State {
    pub members: BTreeMap<u8, Member>,
    /// Service ID → slot of its listener.
    pub services: BTreeMap<u64, u8>,
    /// Slot → when its process was found gone or left (seconds since the
    /// epoch).
    pub freed: BTreeMap<u8, u64>,
}

impl State {
    fn parse(text: &str) -> State {
        let mut s = State::default();
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["member", slot, pid, index] => {
                    if let (Ok(slot), Ok(pid)) = (slot.parse(), pid.parse()) {
                        let index = index.parse().ok();
                        s.members.insert(slot, Member { pid, index });
                    }
                }
                ["service", sid, slot] => {
                    if let (Ok(sid), Ok(slot)) = (u64::from_str_radix(sid, 16), slot.parse()) {
                        s.services.insert(sid, slot);
                    }
                }
                ["freed", slot, at] => {
                    if let (Ok(slot), Ok(at)) = (slot.parse(), at.parse()) {
                        s.freed.insert(slot, at);
                    }
                }
                _ => {}
            }
        }
        s
    }

    fn render(&self) -> String {
        let mut t = String::from("roxe shared address 1\n");
        for (slot, m) in &self.members {
            let index = m.index.map_or("-".to_string(), |i| i.to_string());
            t += &format!("member {slot} {} {index}\n", m.pid);
        }
        for (sid, slot) in &self.services {
            t += &format!("service {sid:x} {slot}\n");
        }
        for (slot, at) in &self.freed {
            t += &format!("freed {slot} {at}\n");
        }
        t
    }

    /// Forget `slot`'s process: its services go with it.
    pub(crate) fn remove(&mut self, slot: u8) {
        self.members.remove(&slot);
        self.services.retain(|_, s| *s != slot);
        self.freed.insert(slot, now_secs());
    }

    /// The free slot to take: never used, else the one freed longest ago.
    /// Peers may still send to a gone process's QPNs (the kernel similarly
    /// delays reusing a QPN): their packets should find nobody rather than
    /// a newcomer, for as long as 254 other slots allow.
    fn free_slot(&self, taken: impl Fn(u8) -> bool) -> Option<u8> {
        (1..=MAX_SLOT)
            .filter(|s| !self.members.contains_key(s) && !taken(*s))
            .min_by_key(|s| self.freed.get(s).copied().unwrap_or(0))
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The registry of one address.
#[derive(Debug)]
pub(crate) struct Registry {
    dir: PathBuf,
    key: String,
}

/// The registry, locked: read on [`Registry::lock`], written by
/// [`Locked::save`], unlocked when dropped.
#[derive(Debug)]
pub(crate) struct Locked<'a> {
    registry: &'a Registry,
    /// Holds the `flock` (on `<key>.lock`, which is never replaced).
    _lock: File,
    pub state: State,
}

fn lock(f: &File, nonblocking: bool) -> io::Result<()> {
    use rustix::fs::{flock, FlockOperation};
    let op = if nonblocking {
        FlockOperation::NonBlockingLockExclusive
    } else {
        FlockOperation::LockExclusive
    };
    flock(f.as_fd(), op).map_err(io::Error::from)
}

fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

impl Registry {
    /// The registry of `addr` in the user's directory.
    pub(crate) fn open(addr: IpAddr) -> io::Result<Registry> {
        use crate::driver::stat::{private_dir, uid};
        // Where every process of the user looks, whatever its
        // XDG_RUNTIME_DIR or TMPDIR: the kernel lets the sockets of one
        // user share a port, and they must share one registry.
        let dir = private_dir(PathBuf::from(format!("/tmp/roxe-{}", uid())))?;
        let dir = private_dir(dir.join("shared"))?;
        // The same address in another network namespace is another
        // port 4791, with a reuseport group of its own.
        let netns = std::fs::read_link("/proc/self/ns/net")
            .ok()
            .and_then(|l| {
                let l = l.to_string_lossy().into_owned();
                Some(l.strip_prefix("net:[")?.strip_suffix(']')?.to_string())
            })
            .unwrap_or_default();
        Ok(Registry {
            dir,
            key: format!("{}-{netns}", addr.to_string().replace(':', "_")),
        })
    }

    /// A registry in `dir` (tests).
    #[cfg(test)]
    pub(crate) fn in_dir(dir: PathBuf, addr: IpAddr) -> Registry {
        Registry {
            dir,
            key: addr.to_string().replace(':', "_"),
        }
    }

    fn slot_path(&self, slot: u8) -> PathBuf {
        self.dir.join(format!("{}.slot{slot}", self.key))
    }

    /// Take the lock and read the state. The lock is waited for at most
    /// [`LOCK_WAIT`]: a process stopped (SIGSTOP, a debugger) while it
    /// held it must not stop every other. Past that the state is read and
    /// written without it: an update may be lost (the next probe round
    /// repairs the indexes), the file is never torn (it is replaced
    /// whole, by rename).
    pub(crate) fn lock(&self) -> io::Result<Locked<'_>> {
        let file = open_rw(&self.dir.join(format!("{}.lock", self.key)))?;
        let end = std::time::Instant::now() + LOCK_WAIT;
        while lock(&file, true).is_err() {
            if std::time::Instant::now() >= end {
                tracing::warn!(
                    registry = %self.data_path().display(),
                    "the shared address's registry stayed locked for {LOCK_WAIT:?} (a process \
                     stopped while it held it?): going on without the lock"
                );
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let text = match std::fs::read_to_string(self.data_path()) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        Ok(Locked {
            registry: self,
            _lock: file,
            state: State::parse(&text),
        })
    }

    fn data_path(&self) -> PathBuf {
        self.dir.join(format!("{}.registry", self.key))
    }
}

/// How long [`Registry::lock`] waits for another process.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A slot held: its file stays locked until this drops (or the process
/// ends).
#[derive(Debug)]
pub(crate) struct SlotHold {
    pub slot: u8,
    _file: File,
}

impl Locked<'_> {
    /// Forget the members whose processes are gone (their slot files can
    /// be locked): the slots found gone.
    pub(crate) fn prune(&mut self, own: Option<u8>) -> Vec<u8> {
        let gone: Vec<u8> = self
            .state
            .members
            .keys()
            .copied()
            .filter(|&s| Some(s) != own && self.is_gone(s))
            .collect();
        for &s in &gone {
            self.state.remove(s);
        }
        gone
    }

    fn is_gone(&self, slot: u8) -> bool {
        match open_rw(&self.registry.slot_path(slot)) {
            // Locked by us now means nobody holds it; dropping the file
            // releases it again.
            Ok(f) => lock(&f, true).is_ok(),
            Err(_) => true,
        }
    }

    /// Take a free slot for process `pid`: hold its file and record it.
    pub(crate) fn claim(&mut self, pid: u32) -> io::Result<SlotHold> {
        let mut tried = Vec::new();
        loop {
            let Some(slot) = self.state.free_slot(|s| tried.contains(&s)) else {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("all {MAX_SLOT} processes this address can hold are running"),
                ));
            };
            tried.push(slot);
            let file = open_rw(&self.registry.slot_path(slot))?;
            // Held by a process the registry lost (its file rewritten by
            // hand, say): not free.
            if lock(&file, true).is_err() {
                continue;
            }
            self.state.members.insert(slot, Member { pid, index: None });
            return Ok(SlotHold { slot, _file: file });
        }
    }

    /// Write the state back: a new file renamed over the old one.
    pub(crate) fn save(&mut self) -> io::Result<()> {
        let path = self.registry.data_path();
        let tmp = path.with_extension(format!("registry.{}", std::process::id()));
        let mut f = open_rw(&tmp)?;
        f.set_len(0)?;
        f.write_all(self.state.render().as_bytes())?;
        std::fs::rename(&tmp, &path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_registry(name: &str) -> Registry {
        let dir =
            std::env::temp_dir().join(format!("roxe-registry-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Registry::in_dir(dir, "127.0.0.9".parse().unwrap())
    }

    #[test]
    fn the_state_survives_a_round_trip_through_its_file() {
        let mut s = State::default();
        s.members.insert(
            3,
            Member {
                pid: 42,
                index: Some(1),
            },
        );
        s.members.insert(
            4,
            Member {
                pid: 43,
                index: None,
            },
        );
        s.services.insert(0x0106_4e21, 3);
        s.freed.insert(9, 1_700_000_000);
        assert_eq!(State::parse(&s.render()), s);
    }

    #[test]
    fn a_held_slot_is_live_and_a_dropped_one_is_gone() {
        let r = temp_registry("live");
        let mut l = r.lock().unwrap();
        let a = l.claim(1).unwrap();
        let b = l.claim(2).unwrap();
        assert_ne!(a.slot, b.slot);
        l.state.services.insert(0x0106_0001, b.slot);
        l.save().unwrap();
        drop(l);
        drop(b);
        let mut l = r.lock().unwrap();
        assert_eq!(l.prune(Some(a.slot)), vec![2]);
        assert!(l.state.services.is_empty(), "the gone slot's services go");
        assert!(l.state.members.contains_key(&a.slot));
        std::fs::remove_dir_all(&r.dir).unwrap();
    }

    #[test]
    fn a_freed_slot_is_taken_last() {
        let r = temp_registry("quiet");
        let mut l = r.lock().unwrap();
        let first = l.claim(1).unwrap();
        assert_eq!(first.slot, 1);
        l.state.remove(1);
        drop(first);
        // Slot 1 was just freed: every never-used slot comes before it.
        let next = l.claim(2).unwrap();
        assert_eq!(next.slot, 2);
        std::fs::remove_dir_all(&r.dir).unwrap();
    }
}
