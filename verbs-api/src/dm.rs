//! Device memory ([`Dm`], `struct ibv_dm`) and the memory regions over it.
//! Soft devices only through the Rust API.

use crate::backend::Backed;
use crate::mr::SoftMr;
use crate::{verbs, AccessFlags, Context, Errno, Mr, Pd, Result};
use roxe_provider::driver::Device;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Device memory (`struct ibv_dm`). Freed when the last handle and the
/// last region over it are dropped.
#[derive(Clone)]
pub struct Dm {
    inner: Arc<DmInner>,
}

struct DmInner {
    dev: Arc<Device>,
    handle: u32,
    len: usize,
    /// Regions registered over it (not every clone is one: imported
    /// structs of the drop-in hold clones too).
    regions: AtomicUsize,
    _ctx: Context,
}

impl Drop for DmInner {
    fn drop(&mut self) {
        // Every region over it (each holds a Dm) is gone by now.
        let _ = self.dev.engine().memory_mut().free_dm(self.handle);
    }
}

/// A region's hold on its device memory, counted in `DmInner::regions`.
pub(crate) struct DmRegion(Dm);

impl DmRegion {
    fn new(dm: &Dm) -> Self {
        dm.inner.regions.fetch_add(1, Ordering::AcqRel);
        DmRegion(dm.clone())
    }
}

impl Drop for DmRegion {
    fn drop(&mut self) {
        self.0.inner.regions.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Context {
    /// `ibv_alloc_dm`: `len` zeroed bytes of device memory aligned to
    /// `2^log_align`, on a soft device a buffer the device owns (at most
    /// `roxe_provider::memory::MAX_DM_SIZE` per device). Copy in and out
    /// with [`Dm::write`] / [`Dm::read`]; register with [`Pd::reg_dm_mr`].
    /// EOPNOTSUPP on a hardware device.
    pub fn alloc_dm(&self, len: usize, log_align: u32) -> Result<Dm> {
        let d = self.inner.imp.soft_only(
            "ibv_alloc_dm",
            "device memory through the Rust API on a hardware device",
        )?;
        let handle = d.engine().memory_mut().alloc_dm(len, log_align)?;
        Ok(Dm {
            inner: Arc::new(DmInner {
                dev: Arc::clone(d),
                handle,
                len,
                regions: Default::default(),
                _ctx: self.clone(),
            }),
        })
    }
}

impl Dm {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// True for an empty buffer (never: `alloc_dm` refuses length 0).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// `ibv_memcpy_to_dm`: offset and length multiples of 4, inside it.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let i = &self.inner;
        Ok(i.dev
            .engine()
            .memory_mut()
            .dm_write(i.handle, offset, data)?)
    }

    /// `ibv_memcpy_from_dm`: offset and length multiples of 4, inside it.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let i = &self.inner;
        Ok(i.dev.engine().memory().dm_read(i.handle, offset, out)?)
    }

    /// Regions are registered over it (`ibv_free_dm` refuses then).
    pub fn has_regions(&self) -> bool {
        self.inner.regions.load(Ordering::Acquire) > 0
    }
}

impl std::fmt::Debug for Dm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dm").field("len", &self.inner.len).finish()
    }
}

impl Pd {
    /// `ibv_reg_dm_mr`: bytes `[offset, offset + len)` of `dm` as a
    /// zero-based memory region (`ZERO_BASED` is required).
    pub fn reg_dm_mr(&self, dm: &Dm, offset: u64, len: usize, access: AccessFlags) -> Result<Mr> {
        let s = self
            .inner
            .imp
            .soft_only("ibv_reg_dm_mr", "on a hardware device")?;
        if !Arc::ptr_eq(&s.dev, &dm.inner.dev) {
            return Err(verbs(
                "ibv_reg_dm_mr",
                Errno::EINVAL,
                "device memory of another device",
            ));
        }
        let info =
            s.dev
                .engine()
                .memory_mut()
                .register_dm(s.id, dm.inner.handle, offset, len, access)?;
        Ok(Mr {
            imp: Backed::Soft(SoftMr {
                dev: s.dev.clone(),
                info,
                len,
            }),
            pd: self.clone(),
            _dm: Some(DmRegion::new(dm)),
        })
    }
}
