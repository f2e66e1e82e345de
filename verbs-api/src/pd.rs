//! Protection domains ([`Pd`], `struct ibv_pd`). What a PD makes is in the
//! module of what it makes (`Pd::reg_mr` in `mr.rs`, `Pd::create_qp` in
//! `qp.rs`, ...).

use crate::backend::{Backed, SoftObj};
use crate::{hw, Context, Result};
use roxe_provider::PdId;
use std::sync::Arc;

/// A protection domain (`struct ibv_pd`).
#[derive(Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

pub(crate) struct PdInner {
    /// Dropped first (fields drop in order): a hardware PD before its
    /// context.
    pub(crate) imp: Backed<SoftObj<PdId>, hw::HwPd>,
    ctx: Context,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        if let Some(s) = self.imp.soft() {
            let _ = s.dev.engine().dealloc_pd(s.id);
        }
    }
}

impl Context {
    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let imp = self.inner.imp.make_child(
            |d| {
                Ok(SoftObj {
                    dev: d.clone(),
                    id: d.engine().alloc_pd(),
                })
            },
            hw::HwPd::alloc,
        )?;
        Ok(Pd {
            inner: Arc::new(PdInner {
                imp,
                ctx: self.clone(),
            }),
        })
    }
}

impl Pd {
    /// The context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}
