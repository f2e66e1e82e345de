//! Completion queues ([`Cq`], `struct ibv_cq`) and the completion
//! channels their events go to ([`CompChannel`],
//! `struct ibv_comp_channel`).

use crate::backend::Backed;
use crate::{
    hw, io, poll_readable, set_fd_nonblocking, soft, verbs, Context, CqId, Errno, Result, WcOpcode,
    WcStatus, WorkCompletion,
};
use roxe_provider::driver::{CallerReceive, Device, EMPTY_POLLS_BEFORE_YIELD};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A completion channel (`struct ibv_comp_channel`): its fd (`AsFd`)
/// becomes readable when a CQ attached to it has an event.
#[derive(Clone)]
pub struct CompChannel {
    imp: Backed<soft::CompChannel, Arc<hw::HwChannel>>,
}

impl std::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

impl Context {
    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        Ok(CompChannel {
            imp: self.inner.imp.make_child(
                |_| soft::CompChannel::new().map_err(io("ibv_create_comp_channel")),
                |h| Ok(Arc::new(hw::HwChannel::create(h)?)),
            )?,
        })
    }

    /// `ibv_create_cq` with `depth` entries, its events going to `channel`
    /// (a channel of this context).
    pub fn create_cq(&self, depth: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        let foreign = || {
            verbs(
                "ibv_create_cq",
                Errno::EINVAL,
                "a channel of another backend",
            )
        };
        let imp = self.inner.imp.make_child(
            |d| {
                let ch = channel
                    .map(|c| c.imp.soft().ok_or_else(foreign))
                    .transpose()?;
                SoftCq::create(d, depth, ch)
            },
            |h| {
                let ch = channel
                    .map(|c| c.imp.hw().ok_or_else(foreign))
                    .transpose()?;
                hw::HwCq::create(h, depth, ch)
            },
        )?;
        Ok(Cq {
            inner: Arc::new(CqInner {
                imp,
                _ctx: self.clone(),
                channel: channel.cloned(),
            }),
        })
    }
}

impl CompChannel {
    /// Wait for the next event (`ibv_get_cq_event`, acknowledged): the
    /// id of the CQ that raised it ([`Cq::id`]).
    pub fn get_event(&self) -> std::io::Result<CqId> {
        self.imp
            .dispatch(|c| c.get_event(), |h| h.get_event().map(CqId))
    }
    /// Wait at most `timeout` for an event.
    pub fn get_event_timeout(&self, timeout: Duration) -> std::io::Result<Option<CqId>> {
        self.imp.dispatch(
            |c| c.get_event_timeout(timeout),
            |h| {
                if !poll_readable(h.fd(), timeout)? {
                    return Ok(None);
                }
                h.get_event().map(|id| Some(CqId(id)))
            },
        )
    }
    /// Make [`get_event`](Self::get_event) fail with `WouldBlock` instead
    /// of waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> std::io::Result<()> {
        self.imp.dispatch(
            |c| c.set_nonblocking(nonblocking),
            |h| set_fd_nonblocking(h.fd(), nonblocking),
        )
    }
}

impl std::os::fd::AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.imp.dispatch(|c| c.as_raw_fd(), |h| h.fd())
    }
}

impl std::os::fd::AsFd for CompChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd belongs to the channel this borrows, open until
        // the channel is dropped.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

/// A completion queue (`struct ibv_cq`).
#[derive(Clone)]
pub struct Cq {
    pub(crate) inner: Arc<CqInner>,
}

pub(crate) struct CqInner {
    /// Dropped first: a hardware CQ before its channel and context.
    pub(crate) imp: Backed<SoftCq, hw::HwCq>,
    /// Kept alive while the CQ is.
    _ctx: Context,
    channel: Option<CompChannel>,
}

/// A CQ of a soft device's engine.
pub(crate) struct SoftCq {
    dev: Arc<Device>,
    pub(crate) id: CqId,
    /// Completions waiting, readable without the engine lock.
    waiting: Arc<AtomicUsize>,
    /// Consecutive polls that found nothing.
    empty_polls: AtomicU32,
}

impl SoftCq {
    /// The engine's id, if the CQ is of `dev`.
    pub(crate) fn id_on(&self, dev: &Arc<Device>) -> Option<CqId> {
        Arc::ptr_eq(&self.dev, dev).then_some(self.id)
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        if let Some(s) = self.imp.soft() {
            if self.channel.is_some() {
                s.dev.detach_channel(s.id);
            }
            let _ = s.dev.engine().destroy_cq(s.id);
        }
    }
}

impl SoftCq {
    /// `ibv_create_cq` on `dev`, its events going to `channel`.
    fn create(dev: &Arc<Device>, depth: u32, channel: Option<&soft::CompChannel>) -> Result<Self> {
        let (id, waiting) = {
            let mut e = dev.engine();
            let id = e.create_cq(depth)?;
            let waiting = e
                .cq_mut(id)
                .map(|c| c.waiting_counter())
                .ok_or_else(|| verbs("ibv_create_cq", Errno::EINVAL, "CQ vanished"))?;
            (id, waiting)
        };
        if let Some(ch) = channel {
            dev.attach_channel(id, ch);
        }
        Ok(SoftCq {
            dev: dev.clone(),
            id,
            waiting,
            empty_polls: AtomicU32::new(0),
        })
    }

    /// `ibv_poll_cq`; `at` receives each completion's engine time (as far
    /// as it reaches).
    fn poll(&self, out: &mut [WorkCompletion], at: &mut [u64]) -> Result<usize> {
        let waiting = &self.waiting;
        // Nothing waiting: receive in this thread (no hand-over from the
        // progress thread for the completion), and without anything received
        // do not take the engine lock.
        if waiting.load(Ordering::Acquire) == 0 {
            let here = self.dev.progress_here();
            if here != CallerReceive::Handled || waiting.load(Ordering::Acquire) == 0 {
                // A program spinning on `poll_cq` leaves the progress thread
                // room to run, when it has work this thread cannot do.
                let n = self.empty_polls.fetch_add(1, Ordering::Relaxed);
                if n % EMPTY_POLLS_BEFORE_YIELD == EMPTY_POLLS_BEFORE_YIELD - 1
                    && self.dev.caller_yields(here)
                {
                    std::thread::yield_now();
                }
                return Ok(0);
            }
        }
        self.empty_polls.store(0, Ordering::Relaxed);
        Ok(self.dev.engine_for_poll().poll_cq_at(self.id, out, at)?)
    }
}

impl Cq {
    /// This CQ's id (what channel events carry).
    pub fn id(&self) -> CqId {
        self.inner.imp.dispatch(|s| s.id, |h| CqId(h.id))
    }
    /// `ibv_poll_cq`: fill `out`, return how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        self.inner
            .imp
            .dispatch_with(out, |s, out| s.poll(out, &mut []), |h, out| h.poll(out))
    }
    /// [`poll`](Self::poll) with each completion's time, as
    /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK` gives it: nanoseconds
    /// since the Unix epoch, monotonic within a device (its clock anchored
    /// to the wall clock when it opened), taken when the device made the
    /// completion. Soft devices only (EOPNOTSUPP on hardware).
    pub fn poll_with_wallclock(
        &self,
        out: &mut [WorkCompletion],
        wallclock_ns: &mut [u64],
    ) -> Result<usize> {
        let s = self.inner.imp.soft_only(
            "ibv_start_poll",
            "completion wall-clock times on a hardware CQ are not built",
        )?;
        let n = s.poll(out, wallclock_ns)?;
        for t in wallclock_ns.iter_mut().take(n) {
            *t = s.dev.wallclock_ns(*t);
        }
        Ok(n)
    }
    /// `ibv_resize_cq`: hold up to `depth` completions; EINVAL below the
    /// number waiting. Soft devices only (EOPNOTSUPP on hardware).
    pub fn resize(&self, depth: u32) -> Result<()> {
        let s = self
            .inner
            .imp
            .soft_only("ibv_resize_cq", "resizing a hardware CQ is not built")?;
        Ok(s.dev.engine().resize_cq(s.id, depth)?)
    }
    /// `ibv_req_notify_cq`: the next completion (or the next solicited one)
    /// raises one event on the channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.inner.imp.dispatch(
            |s| {
                let mut e = s.dev.engine();
                let cq = e
                    .cq_mut(s.id)
                    .ok_or_else(|| verbs("ibv_req_notify_cq", Errno::EINVAL, "CQ destroyed"))?;
                cq.request_notify(solicited_only);
                drop(e);
                // The program is about to sleep on its channel: the progress
                // thread must receive from now on.
                s.dev.caller_sleeps();
                Ok(())
            },
            |h| h.req_notify(solicited_only),
        )
    }
    /// Poll until `n` completions arrived or `timeout` passed (spinning,
    /// then yielding): a convenience for examples and tests.
    pub fn poll_wait(&self, n: usize, timeout: Duration) -> Result<Vec<WorkCompletion>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut out = Vec::with_capacity(n);
        let mut buf = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 32];
        let backoff = crossbeam_utils::Backoff::new();
        while out.len() < n {
            let k = self.poll(&mut buf[..(n - out.len()).min(32)])?;
            out.extend_from_slice(&buf[..k]);
            if k > 0 {
                backoff.reset();
            } else {
                if std::time::Instant::now() >= deadline {
                    return Err(verbs(
                        "ibv_poll_cq",
                        Errno::ETIMEDOUT,
                        format!("{} of {n} completions after {timeout:?}", out.len()),
                    ));
                }
                backoff.snooze();
            }
        }
        Ok(out)
    }
}
