//! Memory regions ([`Mr`], `struct ibv_mr`): a buffer roxe owns, memory
//! the caller owns, or on-demand paging; re-registration. Regions over
//! device memory are made in `dm.rs`.

use crate::backend::Backed;
use crate::dm::DmRegion;
use crate::{hw, verbs, AccessFlags, Errno, Pd, Result, Sge};
use roxe_provider::driver::Device;
use roxe_provider::memory::MrInfo;
use std::sync::Arc;

/// A memory region (`struct ibv_mr`).
pub struct Mr {
    /// Dropped first: deregistered before its PD (and its device memory).
    pub(crate) imp: Backed<SoftMr, hw::HwMr>,
    pub(crate) pd: Pd,
    /// A region over device memory keeps the memory alive.
    pub(crate) _dm: Option<DmRegion>,
}

/// A region in a soft device's memory table.
pub(crate) struct SoftMr {
    pub(crate) dev: Arc<Device>,
    pub(crate) info: MrInfo,
    pub(crate) len: usize,
}

impl Drop for Mr {
    fn drop(&mut self) {
        if let Some(s) = self.imp.soft() {
            // Windows still bound into it are unbound first: after this no
            // remote access reaches the memory, whatever was bound.
            let _ = s
                .dev
                .engine()
                .memory_mut()
                .deregister_unbinding(s.info.lkey);
        }
    }
}

impl Pd {
    /// A region of this PD, served by `imp`.
    fn mr(&self, imp: Backed<SoftMr, hw::HwMr>) -> Mr {
        Mr {
            imp,
            pd: self.clone(),
            _dm: None,
        }
    }

    /// `ibv_reg_mr` of a zeroed buffer of `len` bytes that roxe owns; read
    /// and write it with [`Mr::read`] / [`Mr::write`].
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        let imp = self.inner.imp.make_child(
            |s| {
                Ok(SoftMr {
                    info: s
                        .dev
                        .engine()
                        .memory_mut()
                        .register_owned(s.id, len, access)?,
                    dev: s.dev.clone(),
                    len,
                })
            },
            |h| h.reg_owned(len, access.0),
        )?;
        Ok(self.mr(imp))
    }

    /// `ibv_reg_mr` of memory the caller owns, named `iova` on the wire.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay valid (allocated, not moved) until the
    /// returned [`Mr`] is dropped; remote peers holding the rkey and the
    /// device's progress thread may read or write it at any time while it
    /// is registered, so the caller must not hold Rust references into it
    /// during that time and must only look at data a completion has
    /// announced (the contract of `MemoryTable::register_raw`).
    pub unsafe fn reg_mr_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        let imp = self.inner.imp.make_child(
            |s| {
                Ok(SoftMr {
                    // SAFETY: the caller upholds register_raw's contract
                    // (see above).
                    info: unsafe {
                        s.dev
                            .engine()
                            .memory_mut()
                            .register_raw(s.id, ptr, len, iova, access)?
                    },
                    dev: s.dev.clone(),
                    len,
                })
            },
            |h| {
                // SAFETY: the same contract (valid until the Mr is dropped).
                unsafe { h.reg_raw(ptr, len, iova, access.0) }
            },
        )?;
        Ok(self.mr(imp))
    }

    /// `ibv_reg_mr` with `IBV_ACCESS_ON_DEMAND` (on-demand paging) of
    /// `addr..addr + len` of this process, named `iova` on the wire; `addr`
    /// 0 with `len` `usize::MAX` is an implicit region (the whole address
    /// space). Safe: the memory need not stay mapped. A soft device reaches
    /// it only through `process_vm_readv`/`writev`, so a page that is not
    /// mapped when a request arrives is a remote access error, not a fault;
    /// a real device pages it in through the kernel's ODP.
    pub fn reg_mr_odp(
        &self,
        addr: usize,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        let access = AccessFlags(access.0 | AccessFlags::ON_DEMAND.0);
        let imp = self.inner.imp.make_child(
            |s| {
                Ok(SoftMr {
                    info: s
                        .dev
                        .engine()
                        .memory_mut()
                        .register_odp(s.id, addr, len, iova, access)?,
                    dev: s.dev.clone(),
                    len,
                })
            },
            |h| {
                // SAFETY: an on-demand registration pins nothing and
                // promises nothing about the memory: the kernel resolves
                // each page when the device touches it.
                unsafe { h.reg_raw(addr as *mut u8, len, iova, access.0) }
            },
        )?;
        Ok(self.mr(imp))
    }

    /// `ibv_advise_mr`: prefetch advice for on-demand regions. Each SGE
    /// must name an on-demand region of this PD and lie inside it (EINVAL
    /// otherwise). A soft device resolves every page when it is accessed,
    /// so a valid prefetch has nothing left to do. Soft devices only
    /// through the Rust API (EOPNOTSUPP on hardware).
    pub fn advise_mr(&self, sges: &[Sge]) -> Result<()> {
        const VERB: &str = "ibv_advise_mr";
        let s = self
            .inner
            .imp
            .soft_only(VERB, "through the Rust API on a hardware device")?;
        if sges.is_empty() {
            return Err(verbs(VERB, Errno::EINVAL, "no SGE"));
        }
        let e = s.dev.engine();
        for sge in sges {
            let Some(info) = e.memory().query(sge.lkey) else {
                return Err(verbs(
                    VERB,
                    Errno::EINVAL,
                    format!("no region with lkey {:#x}", sge.lkey),
                ));
            };
            let inside = sge
                .addr
                .checked_sub(info.addr)
                .and_then(|o| o.checked_add(u64::from(sge.length)))
                .is_some_and(|end| end <= info.length);
            if info.pd != s.id || !info.access.contains(AccessFlags::ON_DEMAND) || !inside {
                return Err(verbs(
                    VERB,
                    Errno::EINVAL,
                    format!(
                        "lkey {:#x} is not an on-demand region of this PD holding the range",
                        sge.lkey
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.imp.dispatch(|s| s.info.lkey, |h| h.lkey())
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.imp.dispatch(|s| s.info.rkey, |h| h.rkey())
    }
    /// The address work requests and peers use for byte 0.
    pub fn addr(&self) -> u64 {
        self.imp.dispatch(|s| s.info.addr, |h| h.addr())
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.imp.dispatch(|s| s.len, |h| h.len())
    }
    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// An SGE for `[offset, offset + length)` of this region.
    pub fn sge(&self, offset: usize, length: u32) -> Sge {
        Sge {
            addr: self.addr() + offset as u64,
            length,
            lkey: self.lkey(),
        }
    }

    /// Copy bytes out of a region [`Pd::reg_mr`] allocated.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.imp.dispatch_with(
            out,
            |s, out| {
                s.dev
                    .engine()
                    .memory()
                    .owned_read(s.info.lkey, offset, out)
                    .map_err(|e| verbs("mr.read", Errno::EINVAL, format!("{e:?}")))
            },
            |h, out| h.read(offset, out),
        )
    }
    /// Copy bytes into a region [`Pd::reg_mr`] allocated.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.imp.dispatch(
            |s| {
                s.dev
                    .engine()
                    .memory_mut()
                    .owned_write(s.info.lkey, offset, data)
                    .map_err(|e| verbs("mr.write", Errno::EINVAL, format!("{e:?}")))
            },
            |h| h.write(offset, data),
        )
    }

    /// The byte at `offset` of a region roxe owns, read anew on every call:
    /// what a latency loop polls for the peer's WRITE, as ib_write_lat polls
    /// its buffer. On a soft device this takes the device lock, like
    /// [`read`](Self::read).
    pub fn watch_byte(&self, offset: usize) -> Result<u8> {
        self.imp.dispatch(
            |_| {
                let mut b = [0u8; 1];
                self.read(offset, &mut b)?;
                Ok(b[0])
            },
            |h| h.watch_byte(offset),
        )
    }

    /// How many memory windows are bound into this region (`ibv_dereg_mr`
    /// refuses while any is; dropping the `Mr` unbinds them). Always 0 on
    /// hardware (windows through the Rust API are soft-only).
    pub fn bound_windows(&self) -> u32 {
        self.imp.dispatch(
            |s| s.dev.engine().memory().bound_windows(s.info.lkey),
            |_| 0,
        )
    }

    /// `ibv_rereg_mr` without a new translation: move the region to `pd`
    /// (of the same device) and/or give it `access`, keeping its keys.
    /// Peers and QPs of the old PD are refused from then on. Soft devices
    /// only (EOPNOTSUPP on hardware).
    pub fn rereg(&mut self, pd: Option<&Pd>, access: Option<AccessFlags>) -> Result<()> {
        // SAFETY: no new memory (the translation is kept).
        unsafe { self.rereg_with(pd, access, None) }
    }

    /// `ibv_rereg_mr` with a new translation: the region now covers
    /// `ptr..ptr + len`, addressed as `iova`, optionally in `pd` and with
    /// `access`; its keys stay. Soft devices only (EOPNOTSUPP on hardware).
    ///
    /// # Safety
    /// As [`Pd::reg_mr_raw`], for the new memory.
    pub unsafe fn rereg_translation(
        &mut self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        pd: Option<&Pd>,
        access: Option<AccessFlags>,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.rereg_with(pd, access, Some((ptr, len, iova))) }
    }

    /// Both re-registrations: `translation` is the new memory, if any.
    ///
    /// # Safety
    /// With a translation, as [`Pd::reg_mr_raw`] for its memory.
    unsafe fn rereg_with(
        &mut self,
        pd: Option<&Pd>,
        access: Option<AccessFlags>,
        translation: Option<(*mut u8, usize, u64)>,
    ) -> Result<()> {
        let lkey = self.lkey();
        let SoftMr {
            dev: d,
            info,
            len: old_len,
        } = self.imp.soft_only_mut(
            "ibv_rereg_mr",
            "re-registration on a hardware device is not built",
        )?;
        let new_pd = match pd.map(|p| (p, p.inner.imp.soft())) {
            None => None,
            Some((p, Some(s))) if Arc::ptr_eq(&s.dev, d) => Some((p, s.id)),
            Some(_) => {
                return Err(verbs(
                    "ibv_rereg_mr",
                    Errno::EINVAL,
                    "a PD of another device",
                ))
            }
        };
        let pd_id = new_pd.map(|(_, id)| id);
        let mut e = d.engine();
        *info = match translation {
            None => e.memory_mut().reregister(lkey, pd_id, access)?,
            Some((ptr, len, iova)) => {
                // SAFETY: the caller upholds register_raw's contract for
                // the new memory.
                let i = unsafe {
                    e.memory_mut()
                        .reregister_translation(lkey, ptr, len, iova, pd_id, access)?
                };
                *old_len = len;
                i
            }
        };
        drop(e);
        if let Some((p, _)) = new_pd {
            self.pd = p.clone();
        }
        Ok(())
    }
}
