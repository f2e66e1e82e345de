//! A context's asynchronous events ([`AsyncEvents`], what
//! `ibv_get_async_event` reads).

use crate::backend::Backed;
use crate::{hw, io, poll_readable, set_fd_nonblocking, soft, Context, QpEvent, Result};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::time::Duration;

/// A context's asynchronous event queue ([`Context::async_events`]). Its
/// fd (`AsFd`) becomes readable when an event is pending, for poll, epoll
/// or tokio.
pub struct AsyncEvents {
    imp: Backed<SoftEvents, Arc<hw::HwContext>>,
}

/// A soft device's events, each written by the device's event sink as one
/// 8-byte datagram (QP number, event type) to the other end of `rx`.
struct SoftEvents {
    rx: UnixDatagram,
    /// Subscribed to the device while this lives.
    _sink: Arc<soft::EventSink>,
}

impl Context {
    /// The device's asynchronous QP events from now on (what
    /// `ibv_get_async_event` reads): SQ drained, last WQE reached. On
    /// hardware, the context's own event queue (all events, from its
    /// opening).
    pub fn async_events(&self) -> Result<AsyncEvents> {
        Ok(AsyncEvents {
            imp: self.inner.imp.make_child(
                |d| {
                    let (rx, tx) = UnixDatagram::pair().map_err(io("ibv_get_async_event"))?;
                    tx.set_nonblocking(true)
                        .map_err(io("ibv_get_async_event"))?;
                    let sink: Arc<soft::EventSink> = Arc::new(move |ev: QpEvent| {
                        tracing::debug!(
                            qpn = format_args!("{:#x}", ev.qpn),
                            event_type = ev.event_type,
                            "asynchronous event"
                        );
                        let mut b = [0u8; 8];
                        b[..4].copy_from_slice(&ev.qpn.to_le_bytes());
                        b[4..].copy_from_slice(&ev.event_type.to_le_bytes());
                        // Non-blocking: a reader that never reads loses
                        // events rather than stalling the device.
                        let _ = tx.send(&b);
                    });
                    d.subscribe_events(&sink);
                    Ok(SoftEvents { rx, _sink: sink })
                },
                |h| Ok(h.clone()),
            )?,
        })
    }
}

impl SoftEvents {
    /// The next datagram as an event.
    fn get(&self) -> std::io::Result<QpEvent> {
        let mut b = [0u8; 8];
        loop {
            match self.rx.recv(&mut b) {
                Ok(8) => {
                    let (q, t) = b.split_at(4);
                    let word = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                    return Ok(QpEvent {
                        qpn: word(q),
                        event_type: word(t),
                    });
                }
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl AsyncEvents {
    /// Wait for the next event (`ibv_get_async_event`); with the queue
    /// non-blocking, `WouldBlock` when none is pending.
    pub fn get(&self) -> std::io::Result<QpEvent> {
        self.imp.dispatch(SoftEvents::get, |h| h.get_async_event())
    }

    /// Wait at most `timeout` for the next event.
    pub fn get_timeout(&self, timeout: Duration) -> std::io::Result<Option<QpEvent>> {
        if !poll_readable(self.as_fd().as_raw_fd(), timeout)? {
            return Ok(None);
        }
        match self.get() {
            Ok(e) => Ok(Some(e)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Make [`get`](Self::get) return `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> std::io::Result<()> {
        self.imp.dispatch(
            |s| s.rx.set_nonblocking(nonblocking),
            |h| set_fd_nonblocking(h.async_fd(), nonblocking),
        )
    }
}

impl AsFd for AsyncEvents {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.imp.dispatch(
            |s| s.rx.as_fd(),
            |h| {
                // SAFETY: the context's async fd, open while the context
                // (held here) is.
                unsafe { BorrowedFd::borrow_raw(h.async_fd()) }
            },
        )
    }
}
