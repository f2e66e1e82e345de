//! Memory windows ([`Mw`], `struct ibv_mw`): allocating one, and binding
//! it (type 1 through [`Qp::bind_mw`], type 2 through the work request
//! [`Mw::bind_wr`] makes). Soft devices only through the Rust API.

use crate::{
    verbs, AccessFlags, Errno, Mr, MwBind, MwType, Pd, Qp, Result, SendFlags, SendOpcode, SendWr,
};
use roxe_provider::driver::Device;
use std::sync::Arc;

/// A memory window (`struct ibv_mw`): a remote key for part of a memory
/// region, with rights of its own, bound and unbound without
/// re-registering. Deallocated on drop: its key stops working at once.
pub struct Mw {
    dev: Arc<Device>,
    /// A key the window had (its index names it in the memory table).
    index_key: u32,
    kind: MwType,
    _pd: Pd,
}

impl Drop for Mw {
    fn drop(&mut self) {
        let _ = self.dev.engine().dealloc_mw(self.index_key);
    }
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw")
            .field("type", &self.kind)
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

impl Pd {
    /// `ibv_alloc_mw`: an unbound memory window of `kind` in this PD.
    /// Bind a type 1 window with [`Qp::bind_mw`], a type 2 window with the
    /// work request [`Mw::bind_wr`] makes. Soft devices only (`EOPNOTSUPP`
    /// on a hardware device; C programs reach a real device's windows
    /// through the drop-in).
    pub fn alloc_mw(&self, kind: MwType) -> Result<Mw> {
        let s = self.inner.imp.soft_only(
            "ibv_alloc_mw",
            "memory windows through the Rust API on a hardware device",
        )?;
        let key = s.dev.engine().alloc_mw(s.id, kind)?;
        Ok(Mw {
            dev: s.dev.clone(),
            index_key: key,
            kind,
            _pd: self.clone(),
        })
    }
}

impl Mw {
    /// The window's type.
    pub fn mw_type(&self) -> MwType {
        self.kind
    }

    /// The window's current key (after a bind, the key the bind gave it).
    pub fn rkey(&self) -> u32 {
        self.dev
            .engine()
            .memory()
            .window(self.index_key)
            .map_or(self.index_key, |(_, key)| key)
    }

    /// The key a bind gives the window next: the same index, the next key
    /// byte (`ibv_inc_rkey`).
    pub fn next_rkey(&self) -> u32 {
        let k = self.rkey();
        (k & !0xff) | (k.wrapping_add(1) & 0xff)
    }

    /// A BIND_MW work request binding this window to `[addr, addr + len)`
    /// of `mr` with `access` (remote rights) and the key
    /// [`next_rkey`](Self::next_rkey) (what a type 2 window is bound with,
    /// through `Qp::post_send`; the bind takes effect in send-queue order
    /// and completes as `WcOpcode::BindMw`).
    pub fn bind_wr(&self, wr_id: u64, mr: &Mr, addr: u64, len: u64, access: AccessFlags) -> SendWr {
        let mut wr = SendWr::new(wr_id, SendOpcode::BindMw, Vec::new());
        wr.bind = Some(MwBind {
            mw_rkey: self.rkey(),
            new_rkey: self.next_rkey(),
            mr_lkey: mr.lkey(),
            addr,
            length: len,
            access,
        });
        wr
    }
}

impl Qp {
    /// `ibv_bind_mw`: bind the type 1 window `mw` to `[addr, addr + len)`
    /// of `mr` (`None` with length 0 unbinds it) with `access`, in
    /// send-queue order; the bind completes as `WcOpcode::BindMw` with
    /// `wr_id` when `flags` (or the QP) asks for a completion. Returns the
    /// window's new key, which works once the bind has executed. EINVAL
    /// for a type 2 window or an MR of another PD (libibverbs' checks).
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw(
        &self,
        mw: &Mw,
        mr: Option<&Mr>,
        addr: u64,
        len: u64,
        access: AccessFlags,
        wr_id: u64,
        flags: SendFlags,
    ) -> Result<u32> {
        if mw.kind != MwType::Type1 {
            return Err(verbs("ibv_bind_mw", Errno::EINVAL, "not a type 1 window"));
        }
        if mr.is_none() && (addr != 0 || len != 0) {
            return Err(verbs("ibv_bind_mw", Errno::EINVAL, "a range without an MR"));
        }
        let new_rkey = mw.next_rkey();
        let mut wr = SendWr::new(wr_id, SendOpcode::BindMw, Vec::new());
        wr.flags = flags;
        wr.bind = Some(MwBind {
            mw_rkey: mw.rkey(),
            new_rkey,
            mr_lkey: mr.map_or(0, Mr::lkey),
            addr,
            length: len,
            access,
        });
        self.post_send(wr)?;
        Ok(new_rkey)
    }
}
