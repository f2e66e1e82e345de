//! Soft or hardware: how every verbs object is served by one of the two
//! backends, and the one place that picks the code for it.
//!
//! A device is served by one backend for its whole life ([`Backend`]), and
//! so is everything made from it. Each public object that exists on both
//! (`Context`, `CompChannel`, `AsyncEvents`, `Pd`, `Cq`, `Mr`, `Srq`, `Qp`)
//! holds a [`Backed`]: its soft state (the device whose engine holds it and
//! what the engine calls it) or its hardware object (`hw::HwPd`, ...,
//! owning the pointer the system library returned). The rules, written
//! once here:
//!
//! - a verb runs the soft code on a soft object and the hardware code on a
//!   hardware one ([`Backed::dispatch`], [`Backed::dispatch_with`]);
//! - an object made from another is served by its parent's backend
//!   ([`Backed::make_child`]);
//! - a verb only the soft backend has through the Rust API is refused on
//!   hardware with EOPNOTSUPP ([`Backed::soft_only`]);
//! - an object used with another (a CQ given to `create_qp`, a channel to
//!   `create_cq`) must be of the same backend: [`Backed::soft`] or
//!   [`Backed::hw`] of the other object, `None` being the mismatch.
//!
//! Objects the Rust API makes on soft devices only (memory windows, device
//! memory, XRC domains) hold their soft device directly. The enum is
//! matched inline: no allocation, no dynamic dispatch.

use crate::{verbs, Errno, Result};
use roxe_provider::driver::Device;
use std::sync::Arc;

/// Which implementation serves a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// roxe's own transport over UDP port 4791.
    Soft,
    /// A real RDMA device of the system's libibverbs (mlx5, the kernel's
    /// rxe, ...).
    Hardware,
}

/// One object as its backend holds it: `S` on a soft device, `H` on a
/// hardware one.
#[derive(Clone)]
pub(crate) enum Backed<S, H> {
    /// Served by roxe's engine.
    Soft(S),
    /// Served by the system library.
    Hw(H),
}

/// The soft state of most objects: the engine's id for the object, with
/// the device whose engine holds it. Carrying the device means a soft
/// object can never be paired with a hardware context, and its engine is
/// at hand without going back to the context.
pub(crate) struct SoftObj<Id> {
    pub(crate) dev: Arc<Device>,
    pub(crate) id: Id,
}

impl<Id: Copy> SoftObj<Id> {
    /// The engine's id, if the object is of `dev` (ids of another device's
    /// engine name other objects there, or none).
    pub(crate) fn id_on(&self, dev: &Arc<Device>) -> Option<Id> {
        Arc::ptr_eq(&self.dev, dev).then_some(self.id)
    }
}

impl<S, H> Backed<S, H> {
    /// The backend serving the object.
    pub(crate) fn backend(&self) -> Backend {
        match self {
            Backed::Soft(_) => Backend::Soft,
            Backed::Hw(_) => Backend::Hardware,
        }
    }

    /// Run `soft` on a soft object, `hw` on a hardware one.
    #[inline]
    pub(crate) fn dispatch<'a, R>(
        &'a self,
        soft: impl FnOnce(&'a S) -> R,
        hw: impl FnOnce(&'a H) -> R,
    ) -> R {
        match self {
            Backed::Soft(s) => soft(s),
            Backed::Hw(h) => hw(h),
        }
    }

    /// [`dispatch`](Self::dispatch) handing `arg` to the one that runs:
    /// for a value both would move (a work request) or borrow mutably (a
    /// completion array).
    #[inline]
    pub(crate) fn dispatch_with<'a, A, R>(
        &'a self,
        arg: A,
        soft: impl FnOnce(&'a S, A) -> R,
        hw: impl FnOnce(&'a H, A) -> R,
    ) -> R {
        match self {
            Backed::Soft(s) => soft(s, arg),
            Backed::Hw(h) => hw(h, arg),
        }
    }

    /// A child object of this one, made by `soft` or `hw`: a child is
    /// served by its parent's backend.
    #[inline]
    pub(crate) fn make_child<'a, S2, H2>(
        &'a self,
        soft: impl FnOnce(&'a S) -> Result<S2>,
        hw: impl FnOnce(&'a H) -> Result<H2>,
    ) -> Result<Backed<S2, H2>> {
        match self {
            Backed::Soft(s) => soft(s).map(Backed::Soft),
            Backed::Hw(h) => hw(h).map(Backed::Hw),
        }
    }

    /// The soft state; `None` on hardware.
    #[inline]
    pub(crate) fn soft(&self) -> Option<&S> {
        match self {
            Backed::Soft(s) => Some(s),
            Backed::Hw(_) => None,
        }
    }

    /// The hardware object; `None` on a soft device.
    #[inline]
    pub(crate) fn hw(&self) -> Option<&H> {
        match self {
            Backed::Soft(_) => None,
            Backed::Hw(h) => Some(h),
        }
    }

    /// The soft state for a verb the Rust API has on soft devices only;
    /// on hardware, EOPNOTSUPP naming `verb`, with `detail`.
    #[inline]
    pub(crate) fn soft_only(&self, verb: &'static str, detail: &str) -> Result<&S> {
        self.soft()
            .ok_or_else(|| verbs(verb, Errno::EOPNOTSUPP, detail))
    }

    /// [`soft_only`](Self::soft_only), mutably.
    #[inline]
    pub(crate) fn soft_only_mut(&mut self, verb: &'static str, detail: &str) -> Result<&mut S> {
        match self {
            Backed::Soft(s) => Ok(s),
            Backed::Hw(_) => Err(verbs(verb, Errno::EOPNOTSUPP, detail)),
        }
    }
}
