//! Completion channels (`ibv_comp_channel`): a file descriptor that becomes
//! readable when an armed CQ gets a completion, so programs can sleep in
//! `poll`/`epoll`/tokio instead of spinning. Each event is one datagram on
//! a Unix socket pair carrying the CQ's id, which is what
//! `ibv_get_cq_event` returns.

use crate::engine::CqId;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;

#[derive(Debug)]
pub(crate) struct ChannelShared {
    rx: UnixDatagram,
    tx: UnixDatagram,
}

impl ChannelShared {
    /// Post one event for `cq`. Never blocks the progress thread: with the
    /// socket buffer full (thousands of unread events) the event is dropped,
    /// and the reader still finds the ones already queued.
    pub(crate) fn notify(&self, cq: CqId) {
        let _ = self.tx.send(&cq.0.to_le_bytes());
    }
}

/// A completion channel.
#[derive(Debug, Clone)]
pub struct CompChannel {
    shared: Arc<ChannelShared>,
}

impl CompChannel {
    /// A new channel (blocking reads by default, like libibverbs).
    pub fn new() -> io::Result<Self> {
        let (rx, tx) = UnixDatagram::pair()?;
        tx.set_nonblocking(true)?;
        Ok(CompChannel {
            shared: Arc::new(ChannelShared { rx, tx }),
        })
    }

    pub(crate) fn shared(&self) -> Arc<ChannelShared> {
        Arc::clone(&self.shared)
    }

    /// Wait for the next event and return the CQ it is for
    /// (`ibv_get_cq_event`). With the channel non-blocking, `WouldBlock`
    /// when none is pending.
    pub fn get_event(&self) -> io::Result<CqId> {
        let mut b = [0u8; 4];
        loop {
            match self.shared.rx.recv(&mut b) {
                Ok(4) => return Ok(CqId(u32::from_le_bytes(b))),
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Wait at most `timeout` for an event.
    pub fn get_event_timeout(&self, timeout: std::time::Duration) -> io::Result<Option<CqId>> {
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs() as _,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        let mut fds = [rustix::event::PollFd::new(
            &self.shared.rx,
            rustix::event::PollFlags::IN,
        )];
        if rustix::event::poll(&mut fds, Some(&ts))? == 0 {
            return Ok(None);
        }
        self.get_event().map(Some)
    }

    /// Make `get_event` return `WouldBlock` instead of waiting (the
    /// `O_NONBLOCK` that programs set on `channel->fd`).
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.shared.rx.set_nonblocking(nonblocking)
    }
}

impl AsFd for CompChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.rx.as_fd()
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.shared.rx.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn events_carry_the_cq_and_nonblocking_reads_say_so() {
        let ch = CompChannel::new().unwrap();
        ch.set_nonblocking(true).unwrap();
        assert_eq!(
            ch.get_event().unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        ch.shared().notify(CqId(7));
        ch.shared().notify(CqId(9));
        assert_eq!(ch.get_event().unwrap(), CqId(7));
        assert_eq!(
            ch.get_event_timeout(Duration::from_millis(10)).unwrap(),
            Some(CqId(9))
        );
        assert_eq!(
            ch.get_event_timeout(Duration::from_millis(10)).unwrap(),
            None
        );
    }
}
