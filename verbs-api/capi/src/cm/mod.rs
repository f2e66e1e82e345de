//! The drop-in `librdmacm.so.1`: rdma-core 44's `<rdma/rdma_cma.h>` over
//! roxe's connection manager (`roxe_verbs::cm`), in the same shared object
//! as the drop-in `libibverbs.so.1` (docs/ARCHITECTURE.md says why), so
//! `id->verbs`, `id->pd` and `id->qp` are this library's own objects and
//! the inline helpers of `<rdma/rdma_verbs.h>` work on them.
//!
//! The structure follows librdmacm's `cma.c`, with roxe's CM in the place
//! of the kernel's `rdma_ucm`: ids and events are `#[repr(C)]` containers
//! whose first member is the public struct; an id created without a
//! channel is synchronous (its calls wait for their event); an id cannot
//! be destroyed while events reported for it are not acknowledged.
//!
//! - `id`: ids (`IdPriv`: `rdma_cm_id` + roxe's `CmId` + librdmacm's
//!   private state), their registry, creation and destruction, binding,
//!   address and route resolution, listening, migration and options;
//! - `addr`: socket addresses, `rdma_getaddrinfo`, an id's ports;
//! - `event`: event channels, events (`EventPriv`), their
//!   acknowledgement, and a synchronous id's wait for its event;
//! - `conn`: connecting, accepting, rejecting and disconnecting; ECE and
//!   multicast (not supported);
//! - `qp`: an id's QP and SRQ (with CQs and completion channels of the
//!   id's own when the attributes name none);
//! - `ep`: the synchronous endpoints of `<rdma/rdma_verbs.h>`
//!   (`rdma_create_ep`, `rdma_get_request`);
//! - here: `rdma_get_devices`.
//!
//! Every function returning `int` fails with -1 and errno set, as
//! librdmacm's do.

mod addr;
mod conn;
mod ep;
mod event;
mod id;
mod qp;

use crate::abi::*;
use crate::device::{all_shared_devices, c_list};
use crate::{fail_null, guard};
use std::ffi::c_int;
use std::ptr::null_mut;

/// Every device, opened for rdma_cm (`id->verbs` of the ids on it).
///
/// # Safety
/// `num_devices` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    guard(null_mut(), || match all_shared_devices() {
        // SAFETY: num_devices is NULL or writable (the contract);
        // rdma_free_devices frees the list.
        Ok(list) => unsafe { c_list(&list, num_devices) },
        Err(e) => fail_null(e),
    })
}

/// # Safety
/// `list` is NULL or from `rdma_get_devices`, not used again.
#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: list came from rdma_get_devices (calloc) or is NULL.
    unsafe { libc::free(list.cast()) }
}
