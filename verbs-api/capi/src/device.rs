//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`, the
//! `verbs_context` whose ops table the inline data-path wrappers of
//! `<infiniband/verbs.h>` jump through, and the device/port/GID queries.

use crate::abi::*;
use crate::{guard, set_errno};
use parking_lot::Mutex;
use roxe_provider::driver::EventSink;
use roxe_provider::engine::QpEvent;
use roxe_verbs::{Context, DeviceInfo};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of, zeroed};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::{self, null_mut};
use std::sync::{Arc, OnceLock};

/// One device of the list: the C view and what opens it. Devices are
/// created once per process and never freed, so an `ibv_device*` stays
/// valid for as long as any context opened from it (libibverbs' contract).
struct DeviceEntry {
    dev: *mut ibv_device,
    info: DeviceInfo,
}

// SAFETY: `dev` points to a leaked, never-mutated-after-init ibv_device;
// sharing the pointer between threads is what C callers do anyway.
unsafe impl Send for DeviceEntry {}
// SAFETY: as above; the entry is read-only after creation.
unsafe impl Sync for DeviceEntry {}

static DEVICES: OnceLock<Result<Vec<DeviceEntry>, i32>> = OnceLock::new();

fn devices() -> Result<&'static [DeviceEntry], i32> {
    DEVICES
        .get_or_init(|| {
            let infos = roxe_verbs::soft_devices().map_err(|e| {
                eprintln!("roxe: {e}");
                e.errno()
            })?;
            let base = uverbs_base();
            Ok(infos
                .into_iter()
                .zip(base..)
                .map(|(info, n)| new_device_entry(info, n))
                .collect())
        })
        .as_ref()
        .map(|v| v.as_slice())
        .map_err(|e| *e)
}

/// Devices rdma_cm opened by address that the list does not name
/// (`rdma_bind_addr(127.0.0.5)`): created on first use, never freed.
static EXTRA_DEVICES: Mutex<Vec<&'static DeviceEntry>> = Mutex::new(Vec::new());

/// The `uverbs<N>` number of the first soft device: `ROXE_UVERBS_BASE`
/// (`roxe run` sets it to what its view shows), else the first the host's
/// own devices leave free, as the kernel would number a new device.
fn uverbs_base() -> u32 {
    if let Some(n) = std::env::var("ROXE_UVERBS_BASE")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    std::fs::read_dir("/sys/class/infiniband_verbs")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_prefix("uverbs"))
                        .and_then(|n| n.parse::<u32>().ok())
                })
                .map(|n| n + 1)
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

/// A device of the list, named as the kernel names its files:
/// `dev_name` `uverbs<N>` (`/dev/infiniband/uverbs<N>`, where UCX looks),
/// `dev_path` `/sys/class/infiniband_verbs/uverbs<N>`, `ibdev_path`
/// `/sys/class/infiniband/<name>`.
fn new_device_entry(info: DeviceInfo, uverbs: u32) -> DeviceEntry {
    // SAFETY: ibv_device is plain data; all-zero is a valid (empty-named)
    // value.
    let mut dev: Box<ibv_device> = Box::new(unsafe { zeroed() });
    dev.node_type = IBV_NODE_CA;
    dev.transport_type = IBV_TRANSPORT_IB;
    copy_cstr(&mut dev.name, info.name());
    copy_cstr(&mut dev.dev_name, &format!("uverbs{uverbs}"));
    copy_cstr(
        &mut dev.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs{uverbs}"),
    );
    copy_cstr(
        &mut dev.ibdev_path,
        &format!("/sys/class/infiniband/{}", info.name()),
    );
    DeviceEntry {
        dev: Box::into_raw(dev),
        info,
    }
}

fn entry_of(dev: *mut ibv_device) -> Option<&'static DeviceEntry> {
    if let Some(e) = EXTRA_DEVICES.lock().iter().find(|e| e.dev == dev) {
        return Some(e);
    }
    devices().ok()?.iter().find(|e| e.dev == dev)
}

fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    dst[n] = 0;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    guard(null_mut(), || {
        // roxe's devices first, then the system's (passthrough.rs).
        let mut devs: Vec<*mut ibv_device> = Vec::new();
        if crate::passthrough::soft_wanted() {
            match devices() {
                Ok(d) => devs.extend(d.iter().map(|e| e.dev)),
                Err(e) => {
                    set_errno(e);
                    return null_mut();
                }
            }
        }
        devs.extend(
            crate::passthrough::devices()
                .iter()
                .map(|&p| p as *mut ibv_device),
        );
        // SAFETY: calloc of n+1 pointers; checked for NULL below.
        let list = unsafe { libc::calloc(devs.len() + 1, size_of::<*mut ibv_device>()) }
            .cast::<*mut ibv_device>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return null_mut();
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: `list` has devs.len() + 1 slots.
            unsafe { *list.add(i) = *d };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller passes a valid int* or NULL.
            unsafe { *num_devices = devs.len() as c_int };
        }
        list
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: `list` came from ibv_get_device_list (calloc) or is NULL.
    unsafe { libc::free(list.cast()) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_device(device),
        "ibv_get_device_name",
        fn(*mut ibv_device) -> *const c_char,
        (device),
        std::ptr::null()
    );
    if device.is_null() {
        set_errno(libc::EINVAL);
        return ptr::null();
    }
    // SAFETY: a non-NULL device pointer comes from our list.
    unsafe { (*device).name.as_ptr() }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_device(device),
        "ibv_get_device_guid",
        fn(*mut ibv_device) -> u64,
        (device),
        0
    );
    // Network byte order, as the real library returns it.
    entry_of(device).map(|e| e.info.guid().to_be()).unwrap_or(0)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_device(device),
        "ibv_get_device_index",
        fn(*mut ibv_device) -> c_int,
        (device),
        -1
    );
    match devices() {
        Ok(d) => d
            .iter()
            .position(|e| e.dev == device)
            .map_or(-1, |i| i as c_int),
        Err(_) => -1,
    }
}

/// The context roxe allocates: the `verbs_context` the C side sees (its
/// `context` member is what `ibv_open_device` returns), then roxe's state.
#[repr(C)]
pub(crate) struct RoxeContext {
    pub vctx: verbs_context,
    pub ctx: Context,
    /// The read end of the async event pipe (`context.async_fd`).
    async_read: OwnedFd,
    /// `context.cmd_fd`: a memfd standing for the kernel's command file
    /// (see `crate::import`): a context imported through a `dup` of it
    /// shares this one's objects.
    _cmd_fd: OwnedFd,
    /// The objects of the command file, by handle.
    pub handles: Arc<crate::import::Handles>,
    /// QPN → `ibv_qp*` of this context's QPs, which async events name.
    pub qps: Arc<Mutex<HashMap<u32, usize>>>,
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
        let Some(entry) = entry_of(device) else {
            set_errno(libc::ENODEV);
            return null_mut();
        };
        let ctx = match entry.info.open() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("roxe: {e}");
                set_errno(e.errno());
                return null_mut();
            }
        };
        match open_context(device, ctx, CmdFile::New) {
            Ok(c) => c,
            Err(e) => {
                set_errno(e);
                null_mut()
            }
        }
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

/// The C context of an opened device.
pub(crate) fn open_context(
    device: *mut ibv_device,
    ctx: Context,
    cmd: CmdFile,
) -> Result<*mut ibv_context, i32> {
    {
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
        let (async_read, async_write) = rustix_pipe()?;
        let qps: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
        let event_sink = async_sink(async_write, Arc::clone(&qps));
        // The drop-in opens soft devices only (soft_devices()).
        ctx.soft_device()
            .ok_or(libc::EOPNOTSUPP)?
            .subscribe_events(&event_sink);
        // SAFETY: verbs_context is pointers, ints and a pthread mutex, for
        // all of which all-zero is valid (NULL ops, unlocked mutex).
        let mut vctx: verbs_context = unsafe { zeroed() };
        vctx.sz = size_of::<verbs_context>();
        vctx.query_port = Some(query_port_ex);
        vctx.query_device_ex = Some(query_device_ex);
        vctx.create_qp_ex = Some(crate::verbs::create_qp_ex);
        vctx.create_cq_ex = Some(crate::verbs::create_cq_ex);
        vctx.alloc_parent_domain = Some(crate::verbs::alloc_parent_domain);
        vctx.advise_mr = Some(crate::verbs::advise_mr);
        vctx.alloc_dm = Some(crate::verbs::alloc_dm);
        vctx.free_dm = Some(crate::verbs::free_dm);
        vctx.reg_dm_mr = Some(crate::verbs::reg_dm_mr);
        vctx.create_srq_ex = Some(crate::verbs::create_srq_ex);
        vctx.post_srq_ops = Some(crate::tm::post_srq_ops);
        vctx.get_srq_num = Some(crate::xrc::get_srq_num);
        vctx.query_rt_values = Some(query_rt_values);
        vctx.open_xrcd = Some(crate::xrc::open_xrcd);
        vctx.close_xrcd = Some(crate::xrc::close_xrcd);
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
        crate::verbs::fill_ops(&mut c.ops);
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
}

/// What librdmacm keeps per device (`struct cma_device`): the context all
/// ids on the device share (`id->verbs`) and its PD (`id->pd`).
#[derive(Clone, Copy)]
pub(crate) struct SharedDevice {
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub max_responder_resources: u8,
    pub max_initiator_depth: u8,
}

// SAFETY: the pointers are to leaked, never-freed objects whose public
// fields C reads from any thread, as with librdmacm's.
unsafe impl Send for SharedDevice {}

/// rdma_cm's contexts, by device address: opened on first use and kept
/// for the life of the process, as librdmacm keeps its devices open.
static SHARED: Mutex<Vec<(std::net::IpAddr, SharedDevice)>> = Mutex::new(Vec::new());

/// The shared context of the device `ctx` is open on: the device of the
/// list with that name, else a new entry for it.
pub(crate) fn shared_device(ctx: &Context) -> Result<SharedDevice, i32> {
    let mut shared = SHARED.lock();
    let addr = ctx.addr();
    if let Some((_, d)) = shared.iter().find(|(a, _)| *a == addr) {
        return Ok(*d);
    }
    let listed = devices()
        .ok()
        .and_then(|l| l.iter().find(|e| e.info.name() == ctx.name()));
    let entry: &'static DeviceEntry = match listed {
        Some(e) => e,
        None => {
            let mut extra = EXTRA_DEVICES.lock();
            match extra.iter().find(|e| e.info.name() == ctx.name()) {
                Some(e) => e,
                None => {
                    let info = roxe_verbs::device_at(ctx.name(), addr);
                    let listed = devices().map_or(0, <[DeviceEntry]>::len);
                    let uverbs = uverbs_base() + (listed + extra.len()) as u32;
                    let e: &'static DeviceEntry =
                        Box::leak(Box::new(new_device_entry(info, uverbs)));
                    extra.push(e);
                    e
                }
            }
        }
    };
    let c = open_context(entry.dev, ctx.clone(), CmdFile::New)?;
    // SAFETY: c is the context just opened.
    let pd = unsafe { crate::verbs::ibv_alloc_pd(c) };
    if pd.is_null() {
        return Err(libc::ENOMEM);
    }
    let attr = ctx.query_device();
    let d = SharedDevice {
        ctx: c,
        pd,
        max_responder_resources: attr.max_qp_rd_atom.min(255) as u8,
        max_initiator_depth: attr.max_qp_init_rd_atom.min(255) as u8,
    };
    shared.push((addr, d));
    Ok(d)
}

/// At exit, the captures of rdma_cm's devices (never closed) reach
/// their files. A `.fini_array` entry runs when the process exits normally,
/// after `main` returns or `exit()` is called.
extern "C" fn flush_shared_captures() {
    crate::guard((), || {
        if let Some(shared) = SHARED.try_lock() {
            for (_, d) in shared.iter() {
                // SAFETY: shared contexts are never freed.
                if let Some(d) = unsafe { context(d.ctx) }.and_then(|c| c.ctx.soft_device()) {
                    d.flush_capture();
                }
            }
        }
    });
}

#[used]
#[link_section = ".fini_array"]
static FLUSH_AT_EXIT: extern "C" fn() = flush_shared_captures;

/// `rdma_get_devices`: every listed device, opened for rdma_cm, and those
/// opened by address since.
pub(crate) fn all_shared_devices() -> Result<Vec<*mut ibv_context>, i32> {
    for e in devices()? {
        let ctx = e.info.open().map_err(|e| e.errno())?;
        shared_device(&ctx)?;
    }
    Ok(SHARED.lock().iter().map(|(_, d)| d.ctx).collect())
}

/// A context's command file: an anonymous memfd (its inode names it).
fn command_memfd() -> Result<OwnedFd, i32> {
    // SAFETY: a NUL-terminated name and valid flags.
    let fd = unsafe { libc::memfd_create(c"roxe-context".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE));
    }
    // SAFETY: memfd_create just returned this descriptor, owned by nobody.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The async event pipe: the read end blocking (programs may make it
/// non-blocking themselves), the write end non-blocking so the progress
/// thread never waits on a program that does not read its events.
fn rustix_pipe() -> Result<(OwnedFd, OwnedFd), i32> {
    let mut fds = [0 as c_int; 2];
    let last = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE)
    };
    // SAFETY: pipe2 writes two fds into the 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(last());
    }
    use std::os::fd::FromRawFd;
    // SAFETY: pipe2 just returned these two fds, owned by nobody else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl on an fd we own; F_SETFL takes an int flag argument.
    if unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
        return Err(last());
    }
    Ok((r, w))
}

/// The sink that turns a device's QP events into `ibv_async_event`
/// records on the context's pipe (QPs of other contexts are skipped).
fn async_sink(write: OwnedFd, qps: Arc<Mutex<HashMap<u32, usize>>>) -> Arc<EventSink> {
    Arc::new(move |ev: QpEvent| {
        let Some(&qp) = qps.lock().get(&ev.qpn) else {
            return;
        };
        let rec = ibv_async_event {
            element: qp as *mut c_void,
            event_type: ev.event_type,
        };
        // SAFETY: writes the 16 bytes of `rec` (plain data) to our own
        // non-blocking pipe; a full pipe drops the event, as a kernel
        // event queue overflow would.
        let _ = unsafe {
            libc::write(
                write.as_raw_fd(),
                ptr::addr_of!(rec).cast(),
                size_of::<ibv_async_event>(),
            )
        };
    })
}

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

fn device_attr(c: &RoxeContext) -> ibv_device_attr {
    let a = c.ctx.query_device();
    // SAFETY: plain data, all-zero valid.
    let mut d: ibv_device_attr = unsafe { zeroed() };
    copy_cstr(&mut d.fw_ver, env!("CARGO_PKG_VERSION"));
    d.node_guid = a.node_guid.to_be();
    d.sys_image_guid = a.node_guid.to_be();
    d.max_mr_size = a.max_mr_size;
    d.page_size_cap = a.page_size_cap;
    // rxe's vendor id, and part id 0: perftest then treats the device as
    // generic (plain ibv_post_send, no mlx5dv/efadv calls).
    d.vendor_id = a.vendor_id;
    d.vendor_part_id = 0;
    d.hw_ver = 0;
    let clamp = |v: u32| v.min(i32::MAX as u32) as c_int;
    d.max_qp = clamp(a.max_qp);
    d.max_qp_wr = clamp(a.max_qp_wr);
    d.max_sge = clamp(a.max_sge);
    d.max_sge_rd = clamp(a.max_sge);
    d.max_cq = clamp(a.max_cq);
    d.max_cqe = clamp(a.max_cqe);
    d.max_mr = clamp(a.max_mr);
    // Memory windows (type 1 and 2B, as rxe): they share the key space
    // with memory regions.
    d.max_mw = clamp(a.max_mr);
    d.device_cap_flags |= IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    if c.ctx.backend() == roxe_verbs::Backend::Soft {
        d.device_cap_flags |= IBV_DEVICE_XRC;
    }
    d.max_pd = clamp(a.max_pd);
    d.max_qp_rd_atom = clamp(a.max_qp_rd_atom);
    d.max_res_rd_atom = clamp(a.max_qp_rd_atom.saturating_mul(a.max_qp.min(1024)));
    d.max_qp_init_rd_atom = clamp(a.max_qp_init_rd_atom);
    d.atomic_cap = IBV_ATOMIC_HCA;
    d.max_ah = clamp(a.max_qp);
    d.max_srq = clamp(a.max_srq);
    d.max_srq_wr = clamp(a.max_srq_wr);
    d.max_srq_sge = clamp(a.max_srq_sge);
    d.max_pkeys = a.max_pkeys;
    d.local_ca_ack_delay = 15;
    d.phys_port_cnt = a.phys_port_cnt;
    d
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    ctx: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_context(ctx),
        "ibv_query_device",
        fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
        (ctx, attr),
        libc::EOPNOTSUPP
    );
    guard(libc::EIO, || {
        // SAFETY: ctx is NULL or an open context (C contract).
        let Some(c) = (unsafe { context(ctx) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: attr points to a caller's ibv_device_attr.
        unsafe { attr.write(device_attr(c)) };
        0
    })
}

unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    _input: *const c_void,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: ctx is an open context (the inline wrapper passes its own).
        let Some(c) = (unsafe { context(ctx) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        // SAFETY: plain data, all-zero valid.
        let mut ex: ibv_device_attr_ex = unsafe { zeroed() };
        ex.orig_attr = device_attr(c);
        ex.phys_port_cnt_ex = u32::from(ex.orig_attr.phys_port_cnt);
        if c.ctx.backend() == roxe_verbs::Backend::Soft {
            // On-demand paging: every region of a soft device is reached
            // without pinning, so every operation of RC, UC, UD and XRC
            // works on ODP regions, and an implicit region may cover the
            // whole address space.
            let general = u64::from(IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT);
            put_u64(&mut ex, EX_ODP_GENERAL_CAPS, general);
            let rc = IBV_ODP_SUPPORT_SEND
                | IBV_ODP_SUPPORT_RECV
                | IBV_ODP_SUPPORT_WRITE
                | IBV_ODP_SUPPORT_READ
                | IBV_ODP_SUPPORT_ATOMIC
                | IBV_ODP_SUPPORT_SRQ_RECV;
            put_u32(&mut ex, EX_RC_ODP_CAPS, rc);
            put_u32(
                &mut ex,
                EX_UC_ODP_CAPS,
                IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE,
            );
            put_u32(
                &mut ex,
                EX_UD_ODP_CAPS,
                IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV,
            );
            put_u32(&mut ex, EX_XRC_ODP_CAPS, rc & !IBV_ODP_SUPPORT_RECV);
            // The device clock counts nanoseconds, 64 bits wide.
            put_u64(&mut ex, EX_COMPLETION_TIMESTAMP_MASK, u64::MAX);
            put_u64(&mut ex, EX_HCA_CORE_CLOCK_KHZ, 1_000_000);
            put_u64(
                &mut ex,
                EX_MAX_DM_SIZE,
                roxe_provider::memory::MAX_DM_SIZE as u64,
            );
            let tm = c.ctx.tm_caps();
            let caps = [
                tm.max_rndv_hdr_size,
                tm.max_num_tags,
                if tm.rc { IBV_TM_CAP_RC } else { 0 },
                tm.max_ops,
                tm.max_sge,
            ];
            for (i, v) in caps.into_iter().enumerate() {
                put_u32(&mut ex, EX_TM_CAPS + 4 * i, v);
            }
        }
        let n = attr_size.min(size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's buffer holds attr_size bytes; zero all of
        // them, then copy what we know (a newer, larger struct keeps zeros).
        unsafe {
            ptr::write_bytes(attr.cast::<u8>(), 0, attr_size);
            ptr::copy_nonoverlapping(ptr::addr_of!(ex).cast::<u8>(), attr.cast::<u8>(), n);
        }
        0
    })
}

// Byte offsets in `struct ibv_device_attr_ex` (rdma-core 44, x86_64 and
// aarch64) of the members roxe fills beyond `orig_attr`; they lie in the
// `_ext` words of the mirror (`abi_probe.rs` checks them against verbs.h).
pub(crate) const EX_ODP_GENERAL_CAPS: usize = 240;
pub(crate) const EX_RC_ODP_CAPS: usize = 248;
pub(crate) const EX_UC_ODP_CAPS: usize = 252;
pub(crate) const EX_UD_ODP_CAPS: usize = 256;
pub(crate) const EX_COMPLETION_TIMESTAMP_MASK: usize = 264;
pub(crate) const EX_HCA_CORE_CLOCK_KHZ: usize = 272;
pub(crate) const EX_MAX_DM_SIZE: usize = 376;
pub(crate) const EX_XRC_ODP_CAPS: usize = 392;
/// `struct ibv_tm_caps`: max_rndv_hdr_size, max_num_tags, flags, max_ops,
/// max_sge (five u32s).
pub(crate) const EX_TM_CAPS: usize = 348;

/// The `_ext` word at byte offset `c_offset` of the C struct.
fn ext_word(c_offset: usize) -> usize {
    (c_offset - std::mem::offset_of!(ibv_device_attr_ex, _ext)) / 4
}

fn put_u32(ex: &mut ibv_device_attr_ex, c_offset: usize, v: u32) {
    ex._ext[ext_word(c_offset)] = v;
}

/// A u64 member, as two native-endian words (x86_64 and aarch64 are
/// little-endian).
fn put_u64(ex: &mut ibv_device_attr_ex, c_offset: usize, v: u64) {
    let i = ext_word(c_offset);
    ex._ext[i] = v as u32;
    ex._ext[i + 1] = (v >> 32) as u32;
}

/// `vctx->query_rt_values` (`ibv_query_rt_values_ex`): the device clock
/// now, in its ticks (nanoseconds since the Unix epoch, the clock of
/// `ibv_wc_read_completion_ts`), in `raw_clock.tv_nsec` as mlx5 reports
/// cycles.
///
/// # Safety
/// `ctx` is one of this library's contexts; `values` NULL or the caller's.
unsafe extern "C" fn query_rt_values(ctx: *mut ibv_context, values: *mut ibv_values_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: ctx is one of ours (the op is only in our contexts);
        // values is the caller's.
        let (Some(c), Some(v)) = (unsafe { context(ctx) }, unsafe { values.as_mut() }) else {
            return libc::EINVAL;
        };
        if v.comp_mask & !IBV_VALUES_MASK_RAW_CLOCK != 0 {
            return libc::EINVAL;
        }
        let Some(d) = c.ctx.soft_device() else {
            return libc::EOPNOTSUPP;
        };
        if v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK != 0 {
            let ticks = d.wallclock_ns(d.now());
            v.raw_clock.tv_sec = 0;
            v.raw_clock.tv_nsec = ticks as libc::c_long;
        }
        0
    })
}

fn port_attr(c: &RoxeContext, port: u8) -> Result<ibv_port_attr, c_int> {
    let p = c.ctx.query_port(port).map_err(|e| e.errno())?;
    Ok(ibv_port_attr {
        state: u32::from(p.state),
        max_mtu: p.max_mtu as u32,
        active_mtu: p.active_mtu as u32,
        gid_tbl_len: p.gid_tbl_len as c_int,
        // IBV_PORT_CM_SUP, as rxe: connection management over the GID.
        port_cap_flags: 1 << 16,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: 1,
        active_speed: 1,
        // LinkUp.
        phys_state: 5,
        link_layer: p.link_layer,
        flags: 0,
        port_cap_flags2: 0,
    })
}

/// `vctx->query_port`: writes `len` bytes (the inline `ibv_query_port`
/// passes the caller's `sizeof(struct ibv_port_attr)`).
unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: ctx is an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        match port_attr(c, port) {
            Ok(a) => {
                let n = len.min(size_of::<ibv_port_attr>());
                // SAFETY: the caller's buffer holds `len` bytes.
                unsafe {
                    ptr::write_bytes(attr.cast::<u8>(), 0, len);
                    ptr::copy_nonoverlapping(ptr::addr_of!(a).cast::<u8>(), attr.cast::<u8>(), n);
                }
                0
            }
            Err(e) => e,
        }
    })
}

/// The exported `ibv_query_port@IBVERBS_1.1`: the 48-byte compat layout
/// (programs built against old headers, and the inline wrapper's
/// fallback).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_context(ctx),
        "ibv_query_port",
        fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
        (ctx, port, attr),
        libc::EOPNOTSUPP
    );
    // SAFETY: forwarded contract; 48 bytes is the compat struct's size.
    unsafe { query_port_ex(ctx, port, attr, COMPAT_PORT_ATTR_SIZE) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_context(ctx),
        "ibv_query_gid",
        fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
        (ctx, port, index, gid),
        libc::EOPNOTSUPP
    );
    guard(-1, || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if gid.is_null() || index < 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        match c.ctx.query_gid(port, index as u32) {
            Ok(raw) => {
                // SAFETY: gid points to a caller's ibv_gid.
                unsafe { gid.write(ibv_gid { raw }) };
                0
            }
            // An empty entry of the table reads as the zero GID, as
            // libibverbs reads an unused entry's sysfs file.
            Err(e) if e.errno() == libc::ENODATA => {
                // SAFETY: as above.
                unsafe { gid.write(ibv_gid { raw: [0; 16] }) };
                0
            }
            Err(e) => {
                set_errno(e.errno());
                -1
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_context(ctx),
        "_ibv_query_gid_ex",
        fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int,
        (ctx, port_num, gid_index, entry, flags, entry_size),
        libc::EOPNOTSUPP
    );
    guard(libc::EIO, || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return libc::EINVAL;
        };
        if flags != 0 || entry.is_null() {
            return libc::EINVAL;
        }
        let Ok(port) = u8::try_from(port_num) else {
            return libc::EINVAL;
        };
        if port_attr(c, port).is_err() {
            return libc::EINVAL;
        }
        let Ok(raw) = c.ctx.query_gid(port, gid_index) else {
            // An index past the table or an empty slot.
            return libc::ENODATA;
        };
        let e = gid_entry(raw, gid_index, port_num, ifindex_of(c.ctx.addr()));
        // SAFETY: the caller's entry holds entry_size bytes.
        unsafe { copy_out(&e, entry.cast(), entry_size) };
        0
    })
}

fn gid_entry(raw: [u8; 16], index: u32, port: u32, ifindex: u32) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: ibv_gid { raw },
        gid_index: index,
        port_num: port,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: ifindex,
    }
}

/// The index of the interface that holds `addr` (`lo`, 1, when none does).
fn ifindex_of(addr: std::net::IpAddr) -> u32 {
    roxe_provider::driver::interface_of(addr)
        .and_then(|n| std::ffi::CString::new(n).ok())
        // SAFETY: if_nametoindex reads a NUL-terminated name.
        .map(|n| unsafe { libc::if_nametoindex(n.as_ptr()) })
        .filter(|&i| i != 0)
        .unwrap_or(1)
}

/// Copy at most `size` bytes of `v` to `dst`, zero-filling the rest.
unsafe fn copy_out<T>(v: &T, dst: *mut u8, size: usize) {
    let n = size.min(size_of::<T>());
    // SAFETY: the caller guarantees `dst` holds `size` bytes.
    unsafe {
        ptr::write_bytes(dst, 0, size);
        ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), dst, n);
    }
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_context(ctx),
        "_ibv_query_gid_table",
        fn(*mut ibv_context, *mut ibv_gid_entry, usize, u32, usize) -> isize,
        (ctx, entries, max_entries, flags, entry_size),
        -(libc::EOPNOTSUPP as isize)
    );
    guard(-(libc::EIO as isize), || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return -(libc::EINVAL as isize);
        };
        if flags != 0 || (entries.is_null() && max_entries > 0) {
            return -(libc::EINVAL as isize);
        }
        let mut n = 0usize;
        let Ok(p) = c.ctx.query_port(1) else {
            return -(libc::EINVAL as isize);
        };
        for i in 0..p.gid_tbl_len {
            if let Ok(raw) = c.ctx.query_gid(1, i) {
                if n == max_entries {
                    return -(libc::EINVAL as isize);
                }
                // SAFETY: entries holds max_entries entries of entry_size.
                unsafe {
                    copy_out(
                        &gid_entry(raw, i, 1, ifindex_of(c.ctx.addr())),
                        entries.cast::<u8>().add(n * entry_size),
                        entry_size,
                    )
                };
                n += 1;
            }
        }
        n as isize
    })
}

/// The private `ibv_query_gid_type` (`enum ibv_gid_type_sysfs`).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_context(ctx),
        "ibv_query_gid_type",
        fn(*mut ibv_context, u8, u32, *mut u32) -> c_int,
        (ctx, port_num, index, gid_type),
        libc::EOPNOTSUPP
    );
    guard(-1, || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if gid_type.is_null() || c.ctx.query_gid(port_num, index).is_err() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: gid_type points to the caller's enum.
        unsafe { *gid_type = IBV_GID_TYPE_SYSFS_ROCE_V2 };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_context(ctx),
        "ibv_query_pkey",
        fn(*mut ibv_context, u8, c_int, *mut u16) -> c_int,
        (ctx, port, index, pkey),
        libc::EOPNOTSUPP
    );
    guard(-1, || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            return -1;
        };
        let Ok(p) = c.ctx.query_port(port) else {
            return -1;
        };
        if pkey.is_null() || index < 0 || index as u32 >= u32::from(p.pkey_tbl_len) {
            return -1;
        }
        // The default partition, full membership (big-endian 0xffff).
        // SAFETY: pkey points to the caller's __be16.
        unsafe { *pkey = 0xffff };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_context(ctx),
        "ibv_get_pkey_index",
        fn(*mut ibv_context, u8, u16) -> c_int,
        (ctx, port, pkey),
        libc::EOPNOTSUPP
    );
    let mut p = 0u16;
    // SAFETY: forwarded; &mut p is valid.
    if unsafe { ibv_query_pkey(ctx, port, 0, &mut p) } == 0 && p == pkey {
        return 0;
    }
    set_errno(libc::ENOENT);
    -1
}

/// `ibv_get_async_event`: blocks on the context's async fd (or fails with
/// EAGAIN when the program made it non-blocking). roxe raises
/// `IBV_EVENT_SQ_DRAINED` and `IBV_EVENT_QP_LAST_WQE_REACHED`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    crate::passthrough::pass_through!(
        crate::passthrough::is_system_context(ctx),
        "ibv_get_async_event",
        fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
        (ctx, event),
        libc::EOPNOTSUPP
    );
    guard(-1, || {
        // SAFETY: ctx is NULL or an open context.
        let Some(c) = (unsafe { context(ctx) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if event.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let mut rec = [0u8; 16];
        // SAFETY: reading into a 16-byte stack buffer from our own pipe.
        let n = unsafe { libc::read(c.async_read.as_raw_fd(), rec.as_mut_ptr().cast(), 16) };
        if n != 16 {
            return -1;
        }
        // SAFETY: the pipe carries whole ibv_async_event records.
        unsafe { event.write(ptr::read_unaligned(rec.as_ptr().cast())) };
        0
    })
}

/// QP events count in `qp->events_completed` (under `qp->mutex`), as in
/// libibverbs.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    // SAFETY: event is NULL or the caller's record from
    // ibv_get_async_event.
    let Some(ev) = (unsafe { event.as_ref() }) else {
        return;
    };
    // Events naming an object (CQ, QP, SRQ, WQ) of a real device go back
    // to the system library; device and port events need no ack.
    let names_object = matches!(ev.event_type, 0..=7 | 14..=16 | 19);
    crate::passthrough::pass_through!(
        // SAFETY: an object event names a live object.
        names_object && unsafe { crate::passthrough::is_system_object(ev.element) },
        "ibv_ack_async_event",
        fn(*mut ibv_async_event) -> (),
        (event),
        ()
    );
    if matches!(ev.event_type, 1..=7 | 16) && !ev.element.is_null() {
        let qp = ev.element.cast::<ibv_qp>();
        // SAFETY: QP events name a live QP (programs ack before destroying
        // it); its mutex/cond were initialised at create.
        unsafe {
            libc::pthread_mutex_lock(ptr::addr_of_mut!((*qp).mutex));
            (*qp).events_completed = (*qp).events_completed.wrapping_add(1);
            libc::pthread_cond_signal(ptr::addr_of_mut!((*qp).cond));
            libc::pthread_mutex_unlock(ptr::addr_of_mut!((*qp).mutex));
        }
    }
}
