//! A drop-in `libibverbs.so.1`: the C verbs ABI of rdma-core 44 over roxe,
//! so unmodified RDMA programs (`ibv_rc_pingpong`, perftest, tutorials) run
//! with `LD_LIBRARY_PATH=<dir holding this library as libibverbs.so.1>`.
//!
//! Layout (see docs/ARCHITECTURE.md):
//! - `abi`: the `#[repr(C)]` structs of `<infiniband/verbs.h>`, pinned by
//!   size/offset assertions and checked against the real header in a test;
//! - `device`: device list, open/close, the `verbs_context` with its ops
//!   table (the inline `ibv_post_send`/`ibv_poll_cq`/... jump through it),
//!   queries, async events;
//! - `verbs`: PD, MR, CQ, completion channels, SRQ, QP, AH and the data path;
//! - `import`: sharing objects between contexts on one command file
//!   (`ibv_import_device`, `ibv_import_pd`/`_mr`/`_dm`);
//! - `qp_ex`: the `ibv_wr_*` post-send API of QPs from `ibv_create_qp_ex`;
//! - `tm`: tag-matching SRQs (`IBV_SRQT_TM`, `ibv_post_srq_ops`);
//! - `stubs`: the rest of the 146 exported symbols (helpers, strings,
//!   kernel-only and private entry points) with a real provider's answer
//!   for what roxe does not support;
//! - `symbols`: binds every exported symbol to its version node.
//!
//! Every exported function runs its body under [`guard`]: a panic never
//! unwinds into C, it becomes the verb's error value with errno set.

#![allow(clippy::missing_safety_doc)]

pub use roxe_verbs::abi;
#[cfg(test)]
mod abi_probe;
mod cm;
mod device;
mod import;
mod passthrough;
mod qp_ex;
mod rsocket;
mod stubs;
mod symbols;
mod tm;
mod verbs;
mod xrc;

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Tells roxe's hardware backend that this file is the drop-in, not the
/// system's libibverbs (it searches library files for the string).
#[used]
static DROP_IN_MARKER: &str = roxe_verbs::hw::DROP_IN_MARKER;

/// Set the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot,
    // valid for the thread's lifetime.
    unsafe { *libc::__errno_location() = e };
}

/// Run an exported function's body; a panic returns `on_panic` with errno
/// EIO instead of unwinding into the C caller (undefined behaviour).
pub(crate) fn guard<R>(on_panic: R, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}
