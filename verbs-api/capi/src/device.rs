//! The device list: `ibv_get_device_list` (roxe's soft devices, then the
//! system's, see `passthrough`), `ibv_free_device_list`, the device's name,
//! GUID and index, and the devices rdma_cm shares between its ids.
//! Opening a device is `context`'s.

use crate::abi::*;
use crate::context::{context, open_context, CmdFile};
use crate::{fail_null, guard, set_errno};
use parking_lot::Mutex;
use roxe_verbs::{Context, DeviceInfo};
use std::ffi::{c_char, c_int};
use std::mem::{size_of, zeroed};
use std::ptr::{self, null_mut};
use std::sync::OnceLock;

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

/// The soft devices of the list, created at the first call.
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
    roxe_verbs::first_free_uverbs()
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

/// The entry of a device of the list (or one rdma_cm opened by address).
fn entry_of(dev: *mut ibv_device) -> Option<&'static DeviceEntry> {
    if let Some(e) = EXTRA_DEVICES.lock().iter().find(|e| e.dev == dev) {
        return Some(e);
    }
    devices().ok()?.iter().find(|e| e.dev == dev)
}

/// Open the soft device `device` names (ENODEV for one not of the list).
pub(crate) fn open_listed(device: *mut ibv_device) -> Result<Context, c_int> {
    let entry = entry_of(device).ok_or(libc::ENODEV)?;
    entry.info.open().map_err(|e| {
        eprintln!("roxe: {e}");
        e.errno()
    })
}

/// Copy `s` into a C string buffer, cut to fit its NUL.
pub(crate) fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    dst[n] = 0;
}

/// # Safety
/// `num_devices` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    guard(null_mut(), || {
        // roxe's devices first, then the system's (passthrough.rs).
        let mut devs: Vec<*mut ibv_device> = Vec::new();
        if crate::passthrough::soft_wanted() {
            match devices() {
                Ok(d) => devs.extend(d.iter().map(|e| e.dev)),
                Err(e) => return fail_null(e),
            }
        }
        devs.extend(
            crate::passthrough::devices()
                .iter()
                .map(|&p| p as *mut ibv_device),
        );
        // SAFETY: num_devices is NULL or writable (the contract).
        unsafe { c_list(&devs, num_devices) }
    })
}

/// A NULL-terminated array of `items` for C (`ibv_get_device_list`,
/// `rdma_get_devices`), from `calloc`: the program frees it with the
/// verb's `free` counterpart. Its length goes to `*count` unless `count`
/// is NULL. NULL with errno ENOMEM when it cannot be allocated.
///
/// # Safety
/// `count` is NULL or writable.
pub(crate) unsafe fn c_list<T>(items: &[*mut T], count: *mut c_int) -> *mut *mut T {
    // SAFETY: calloc of len + 1 pointers (the last stays NULL); checked for
    // NULL below.
    let list = unsafe { libc::calloc(items.len() + 1, size_of::<*mut T>()) }.cast::<*mut T>();
    if list.is_null() {
        return fail_null(libc::ENOMEM);
    }
    for (i, item) in items.iter().enumerate() {
        // SAFETY: `list` has items.len() + 1 slots.
        unsafe { *list.add(i) = *item };
    }
    if !count.is_null() {
        // SAFETY: per the contract.
        unsafe { *count = items.len() as c_int };
    }
    list
}

/// # Safety
/// `list` is NULL or from `ibv_get_device_list`, not used again.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: `list` came from ibv_get_device_list (calloc) or is NULL.
    unsafe { libc::free(list.cast()) }
}

/// # Safety
/// `device` is NULL or a device of a list from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    crate::passthrough::pass_through!(
        device device,
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

/// # Safety
/// `device` is NULL or a device of a list from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    crate::passthrough::pass_through!(
        device device,
        "ibv_get_device_guid",
        fn(*mut ibv_device) -> u64,
        (device),
        0
    );
    // Network byte order, as the real library returns it.
    entry_of(device).map(|e| e.info.guid().to_be()).unwrap_or(0)
}

/// # Safety
/// `device` is NULL or a device of a list from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    crate::passthrough::pass_through!(
        device device,
        "ibv_get_device_index",
        fn(*mut ibv_device) -> c_int,
        (device),
        -1
    );
    // A soft device has no kernel index (rdma-core's -1 for a device the
    // kernel's RDMA netlink does not know): an index would name whatever
    // kernel device has it to programs that ask the kernel about it (UCX
    // asks whether it is an SMI device).
    -1
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
    let pd = unsafe { crate::pd::ibv_alloc_pd(c) };
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
