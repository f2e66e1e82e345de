//! Contexts: `ibv_open_device` and `ibv_close_device`. A context is a
//! `RoxeContext`: the `verbs_context` the C side sees, whose ops tables
//! the inline verbs of `<infiniband/verbs.h>` jump through (the data path
//! in `ctx->ops`, the extended verbs in the `verbs_context`), followed by
//! roxe's `Context` and the context's command file, async event pipe and
//! QP registry.

use crate::abi::*;
use crate::{fail_null, guard, last_errno};
use parking_lot::Mutex;
use roxe_provider::driver::EventSink;
use roxe_verbs::Context;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::mem::{offset_of, size_of, zeroed};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::{self, null_mut};
use std::sync::Arc;

/// The context roxe allocates: the `verbs_context` the C side sees (its
/// `context` member is what `ibv_open_device` returns), then roxe's state.
#[repr(C)]
pub(crate) struct RoxeContext {
    pub(crate) vctx: verbs_context,
    pub(crate) ctx: Context,
    /// The read end of the async event pipe (`context.async_fd`).
    pub(crate) async_read: OwnedFd,
    /// `context.cmd_fd`: a memfd standing for the kernel's command file
    /// (see `crate::import`): a context imported through a `dup` of it
    /// shares this one's objects.
    _cmd_fd: OwnedFd,
    /// The objects of the command file, by handle.
    pub(crate) handles: Arc<crate::import::Handles>,
    /// QPN → `ibv_qp*` of this context's QPs, which async events name.
    pub(crate) qps: Arc<Mutex<HashMap<u32, usize>>>,
    /// Writes the device's QP events into the pipe while the context lives.
    _event_sink: Arc<EventSink>,
}

const CONTEXT_OFFSET: usize = offset_of!(RoxeContext, vctx) + offset_of!(verbs_context, context);

/// The roxe context behind an `ibv_context*` this library returned.
///
/// # Safety
/// `ctx` must be NULL or a pointer `ibv_open_device` returned and that has
/// not been closed.
pub(crate) unsafe fn context<'a>(ctx: *mut ibv_context) -> Option<&'a RoxeContext> {
    if ctx.is_null() {
        return None;
    }
    // SAFETY: per the contract, ctx is the `context` member of a live
    // RoxeContext, CONTEXT_OFFSET bytes into it.
    Some(unsafe { &*ctx.cast::<u8>().sub(CONTEXT_OFFSET).cast::<RoxeContext>() })
}

/// # Safety
/// `device` is NULL or a device of a list from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    if crate::passthrough::is_system_device(device) {
        let open = crate::passthrough::symbol::<
            unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
        >("ibv_open_device");
        // SAFETY: the system library's ibv_open_device on its own device.
        let ctx = open.map_or(null_mut(), |f| unsafe { f(device) });
        if !ctx.is_null() {
            crate::passthrough::track_context(ctx, true);
        }
        return ctx;
    }
    guard(null_mut(), || {
        crate::device::open_listed(device)
            .and_then(|ctx| open_context(device, ctx, CmdFile::New))
            .unwrap_or_else(fail_null)
    })
}

/// The command file of a context being opened.
pub(crate) enum CmdFile {
    /// A new one (`ibv_open_device`).
    New,
    /// The caller's descriptor of an existing one (`ibv_import_device`),
    /// owned by the context once it is open (not on failure).
    Imported {
        fd: std::os::fd::RawFd,
        handles: Arc<crate::import::Handles>,
    },
}

/// The C context of an opened device, on a new or an imported command
/// file.
pub(crate) fn open_context(
    device: *mut ibv_device,
    ctx: Context,
    cmd: CmdFile,
) -> Result<*mut ibv_context, c_int> {
    // The caller's descriptor is taken over only once nothing can fail.
    enum Fd {
        Own(OwnedFd),
        Callers(std::os::fd::RawFd),
    }
    let (cmd_fd, handles) = match cmd {
        CmdFile::New => {
            let fd = command_memfd()?;
            let h = crate::import::Handles::register(fd.as_fd(), device, ctx.clone())?;
            (Fd::Own(fd), h)
        }
        CmdFile::Imported { fd, handles } => (Fd::Callers(fd), handles),
    };
    let (async_read, async_write) = crate::async_event::pipe()?;
    let qps: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
    let event_sink = crate::async_event::sink(async_write, Arc::clone(&qps));
    // The drop-in opens soft devices only (soft_devices()).
    ctx.soft_device()
        .ok_or(libc::EOPNOTSUPP)?
        .subscribe_events(&event_sink);
    // SAFETY: verbs_context is pointers, ints and a pthread mutex, for
    // all of which all-zero is valid (NULL ops, unlocked mutex).
    let mut vctx: verbs_context = unsafe { zeroed() };
    vctx.sz = size_of::<verbs_context>();
    fill_ops(&mut vctx);
    let c = &mut vctx.context;
    c.device = device;
    // Nothing fails from here on: an imported descriptor becomes ours.
    let cmd_fd = match cmd_fd {
        Fd::Own(fd) => fd,
        // SAFETY: the caller's open descriptor, which libibverbs'
        // contract hands to the imported context (closed with it).
        Fd::Callers(raw) => unsafe { OwnedFd::from_raw_fd(raw) },
    };
    c.cmd_fd = cmd_fd.as_raw_fd();
    c.async_fd = async_read.as_raw_fd();
    c.num_comp_vectors = 1;
    c.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
    // Extended verbs present: the inline `_ex` wrappers look at vctx.
    c.abi_compat = usize::MAX as *mut c_void;
    let rc = Box::new(RoxeContext {
        vctx,
        ctx,
        async_read,
        _cmd_fd: cmd_fd,
        handles,
        qps,
        _event_sink: event_sink,
    });
    let raw = Box::into_raw(rc);
    // SAFETY: raw is a live, uniquely owned allocation.
    Ok(unsafe { ptr::addr_of_mut!((*raw).vctx.context) })
}

/// The ops tables of a context: the extended verbs in the `verbs_context`,
/// which the inline `ibv_*_ex` wrappers (and `ibv_query_port`) call, and
/// `ctx->ops`, the data path the inline `ibv_post_send`, `ibv_poll_cq`,
/// ... jump through.
fn fill_ops(vctx: &mut verbs_context) {
    vctx.query_port = Some(crate::query::query_port_ex);
    vctx.query_device_ex = Some(crate::query::query_device_ex);
    vctx.query_rt_values = Some(crate::query::query_rt_values);
    vctx.create_qp_ex = Some(crate::qp::create_qp_ex);
    vctx.create_cq_ex = Some(crate::cq::create_cq_ex);
    vctx.alloc_parent_domain = Some(crate::pd::alloc_parent_domain);
    vctx.advise_mr = Some(crate::mr::advise_mr);
    vctx.alloc_dm = Some(crate::dm::alloc_dm);
    vctx.free_dm = Some(crate::dm::free_dm);
    vctx.reg_dm_mr = Some(crate::dm::reg_dm_mr);
    vctx.create_srq_ex = Some(crate::srq::create_srq_ex);
    vctx.post_srq_ops = Some(crate::tm::post_srq_ops);
    vctx.get_srq_num = Some(crate::xrc::get_srq_num);
    vctx.open_xrcd = Some(crate::xrc::open_xrcd);
    vctx.close_xrcd = Some(crate::xrc::close_xrcd);
    let ops = &mut vctx.context.ops;
    ops.poll_cq = Some(crate::cq::poll_cq);
    ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    ops.post_send = Some(crate::post::post_send);
    ops.post_recv = Some(crate::post::post_recv);
    ops.post_srq_recv = Some(crate::post::post_srq_recv);
    ops.alloc_mw = Some(crate::mw::alloc_mw);
    ops.bind_mw = Some(crate::mw::bind_mw);
    ops.dealloc_mw = Some(crate::mw::dealloc_mw);
}

/// A context's command file: an anonymous memfd (its inode names it).
fn command_memfd() -> Result<OwnedFd, i32> {
    // SAFETY: a NUL-terminated name and valid flags.
    let fd = unsafe { libc::memfd_create(c"roxe-context".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: memfd_create just returned this descriptor, owned by nobody.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's)
/// whose objects are all destroyed; it is not used again once closed.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    if crate::passthrough::is_system_context(ctx) {
        let close = crate::passthrough::symbol::<unsafe extern "C" fn(*mut ibv_context) -> c_int>(
            "ibv_close_device",
        );
        // SAFETY: the system library's ibv_close_device on its context.
        let rc = close.map_or(libc::EOPNOTSUPP, |f| unsafe { f(ctx) });
        if rc == 0 {
            crate::passthrough::track_context(ctx, false);
        }
        return rc;
    }
    guard(libc::EIO, || {
        if ctx.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ctx was returned by ibv_open_device (the C contract), so
        // it sits CONTEXT_OFFSET bytes into a Box<RoxeContext>.
        drop(unsafe { Box::from_raw(ctx.cast::<u8>().sub(CONTEXT_OFFSET).cast::<RoxeContext>()) });
        0
    })
}
