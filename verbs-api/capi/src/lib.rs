//! A drop-in `libibverbs.so.1`: the C verbs ABI of rdma-core 44 over roxe,
//! so unmodified RDMA programs (`ibv_rc_pingpong`, perftest, tutorials) run
//! with `LD_LIBRARY_PATH=<dir holding this library as libibverbs.so.1>`;
//! the same object is the drop-in `librdmacm.so.1` (`cm`).
//!
//! Layout (see docs/ARCHITECTURE.md):
//! - `object`: how every verbs object is a Rust container behind the
//!   public C struct: handed out, found again, counting its users,
//!   destroyed;
//! - `device`: the device list; `context`: `ibv_open_device` /
//!   `ibv_close_device` and the ops tables the inline verbs of verbs.h jump
//!   through; `query`: device, port, GID and P_Key queries;
//!   `async_event`: the async event pipe and its verbs;
//! - a file per verbs object: `pd` (and parent domains), `mr`, `dm`
//!   (device memory), `mw`, `comp_channel`, `cq` (with the extended CQ's
//!   polling), `srq`, `qp`, `ah`; `post`: posting work requests (the data
//!   path); `qp_ex`: the `ibv_wr_*` post-send API of QPs from
//!   `ibv_create_qp_ex`;
//! - `xrc`: XRC domains, SRQs and XRC_RECV QPs; `tm`: tag-matching SRQs;
//!   `import`: sharing objects between contexts on one command file;
//! - `cm`: librdmacm; `rsocket`: rsockets (not supported);
//! - `passthrough`: real devices' verbs forwarded to the system library;
//! - `stubs`: the rest of the exported symbols (helpers, strings,
//!   kernel-only and private entry points) with a real provider's answer
//!   for what roxe does not support;
//! - `symbols`: binds every exported symbol to its version node.
//!
//! Every exported function runs its body under [`guard`]: a panic never
//! unwinds into C, it becomes the verb's error value with errno set.

#![deny(clippy::undocumented_unsafe_blocks)]

pub use roxe_verbs::abi;
#[cfg(test)]
mod abi_probe;
mod ah;
mod async_event;
mod cm;
mod comp_channel;
mod context;
mod cq;
mod device;
mod dm;
mod import;
mod mr;
mod mw;
mod object;
mod passthrough;
mod pd;
mod post;
mod qp;
mod qp_ex;
mod query;
mod rsocket;
mod srq;
mod stubs;
mod symbols;
mod tm;
mod xrc;

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Tells roxe's hardware backend that this file is the drop-in, not the
/// system's libibverbs (it searches library files for the string).
#[used]
static DROP_IN_MARKER: &str = roxe_verbs::hw::DROP_IN_MARKER;

/// Set the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
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

/// The failure of a verb that returns a pointer: NULL, with `errno` set.
pub(crate) fn fail_null<T>(errno: c_int) -> *mut T {
    set_errno(errno);
    std::ptr::null_mut()
}

/// The failure of a verb that returns -1 and leaves the error in `errno`
/// (`ibv_get_cq_event`, `ibv_query_gid`, every librdmacm verb, ...).
pub(crate) fn fail_minus_one(errno: c_int) -> c_int {
    set_errno(errno);
    -1
}

/// The error the last failed libc call left in `errno`.
pub(crate) fn last_errno() -> c_int {
    // Always Some: last_os_error reads errno.
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}
