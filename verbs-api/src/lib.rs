//! roxe's Rust verbs API: devices, protection domains, memory regions,
//! completion queues and channels, queue pairs, shared receive queues and
//! address handles, with the names and semantics of libibverbs.
//!
//! Objects are reference-counted handles: a QP keeps its PD and CQs alive,
//! an MR its PD, and everything its device, so nothing can outlive what it
//! depends on; each frees its resource on drop. Every failing verb returns
//! an [`Error`] naming the verb and carrying the errno libibverbs would.
//!
//! ```no_run
//! use roxe_verbs::*;
//! let dev = devices()?.remove(0).open()?;
//! let pd = dev.alloc_pd()?;
//! let cq = dev.create_cq(16, None)?;
//! let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?;
//! # Ok::<(), Error>(())
//! ```
//!
//! The backend is chosen per device ([`Backend`]). The soft backend is
//! roxe's own transport over UDP. The system's real RDMA devices are
//! [`Backend::Hardware`] ([`hw`]: the system libibverbs, loaded at run
//! time); they open into the same public types, and the few verbs the Rust
//! API has on soft devices only say so with EOPNOTSUPP.
//! `ROXE_BACKEND=soft|hardware|auto` chooses what [`devices`] offers.
//!
//! # Where things are
//!
//! One module per verbs object. Each holds the object, the verbs that
//! make it (`Pd::create_qp` is in `qp.rs`, `Context::create_cq` in
//! `cq.rs`) and its own verbs:
//!
//! | module | holds |
//! |---|---|
//! | `backend` | [`Backend`] and how each object is soft or hardware: the one place the code for a backend is picked |
//! | `device` | [`DeviceInfo`], [`devices`] and the other ways to find or open a device |
//! | `context` | [`Context`] (an open device) and its queries ([`DeviceAttr`], [`PortAttr`], [`TmCaps`]) |
//! | `async_events` | [`AsyncEvents`] |
//! | `pd` | [`Pd`] |
//! | `mr` | [`Mr`] (owned, caller's and on-demand memory) |
//! | `cq` | [`Cq`] and [`CompChannel`] |
//! | `qp` | [`Qp`], [`QpInit`], [`Endpoint`] and the connect helpers |
//! | `srq` | [`Srq`] (plain, XRC and tag-matching) |
//! | `ah` | [`Ah`] |
//! | `mw` | [`Mw`] and binding it |
//! | `dm` | [`Dm`] and regions over it |
//! | `xrc` | [`Xrcd`] and [`XrcRecvQp`] |
//! | [`cm`] | rdma_cm's model |
//! | [`hw`] | the hardware backend's objects over the system library |
//! | `abi` | the C layouts shared with the drop-in and the hardware backend |

pub use roxe_provider::driver::{DeviceConfig, DeviceStats, FaultSpec, IcrcMode, PacingConfig};
pub use roxe_provider::engine::{
    tmh_op, CqId, QpCap, QpEvent, SrqOp, SrqOpKind, Tmh, RVH_LEN, TMH_LEN,
};
pub use roxe_provider::memory::{MwBind, MwType, Sge, MAX_DM_SIZE};
pub use roxe_provider::qp_attr::{AddressVector, AttrMask, Mtu, QpAttr, QpState, QpType};
pub use roxe_provider::wr::{
    wc_flags, RecvWr, SendFlags, SendOpcode, SendWr, UdDest, WorkCompletion,
};
pub use roxe_provider::{driver as soft, wire};
pub use roxe_provider::{AccessFlags, Errno, VerbsError, WcOpcode, WcStatus};

#[doc(hidden)]
pub mod abi;
pub mod cm;
pub mod hw;

mod ah;
mod async_events;
mod backend;
mod context;
mod cq;
mod device;
mod dm;
mod mr;
mod mw;
mod pd;
mod qp;
mod srq;
mod xrc;

pub use ah::Ah;
pub use async_events::AsyncEvents;
pub use backend::Backend;
pub use context::{Context, DeviceAttr, PortAttr, TmCaps, SOFT_GID_TABLE_LEN};
pub use cq::{CompChannel, Cq};
pub use device::{
    device_at, device_with, devices, first_free_uverbs, hardware_devices, open_at, soft_devices,
    DeviceInfo,
};
pub use dm::Dm;
pub use mr::Mr;
pub use mw::Mw;
pub use pd::Pd;
pub use qp::{Endpoint, Qp, QpInit};
pub use srq::Srq;
pub use xrc::{XrcRecvQp, Xrcd};

use std::os::fd::RawFd;
use std::time::Duration;

/// A failed verb.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The verb was refused (the errno libibverbs would give).
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// An operating-system error (opening a device's socket, a channel).
    #[error("{verb}: {source}")]
    Io {
        /// The failing verb.
        verb: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// The environment's configuration is invalid.
    #[error(transparent)]
    Config(#[from] roxe_provider::driver::ConfigError),
}

impl Error {
    /// The errno a C caller would see.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Verbs(e) => e.errno.0,
            Error::Io { source, .. } => source
                .raw_os_error()
                // An error with context (driver::NeedsCapNetRaw) carries
                // the OS error as its source.
                .or_else(|| {
                    std::error::Error::source(source)
                        .and_then(|e| e.downcast_ref::<std::io::Error>())
                        .and_then(std::io::Error::raw_os_error)
                })
                .unwrap_or(libc::EIO),
            Error::Config(_) => Errno::EINVAL.0,
        }
    }
}

/// Result of a verb.
pub type Result<T> = std::result::Result<T, Error>;

/// An `Error::Io` of `verb`, for `map_err`.
fn io(verb: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { verb, source }
}

/// `verb` refused with `errno`.
fn verbs(verb: &'static str, errno: Errno, detail: impl Into<String>) -> Error {
    Error::Verbs(VerbsError::new(verb, errno, detail))
}

/// Whether `fd` became readable within `timeout`.
fn poll_readable(fd: RawFd, timeout: Duration) -> std::io::Result<bool> {
    // SAFETY: fd is open for the duration of the call (its owner is
    // borrowed by the caller).
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    Ok(rustix::event::poll(&mut fds, Some(&ts))? > 0)
}

/// Set or clear `O_NONBLOCK` on `fd`.
fn set_fd_nonblocking(fd: RawFd, nonblocking: bool) -> std::io::Result<()> {
    // SAFETY: as in poll_readable.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mut fl = rustix::fs::fcntl_getfl(fd)?;
    fl.set(rustix::fs::OFlags::NONBLOCK, nonblocking);
    Ok(rustix::fs::fcntl_setfl(fd, fl)?)
}
