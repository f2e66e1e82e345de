//! Real devices through the drop-in: `ibv_get_device_list` returns roxe's
//! devices first, then the system library's (`mlx5_0`, `rxe0`, ...), and
//! every verb on an object of a real device is forwarded to the system
//! library's function of the same name, so one program can use `roxe0` and
//! `mlx5_0` side by side.
//!
//! The system library is `roxe_verbs::hw`'s: found on disk (never this
//! drop-in), `dlmopen`ed into a namespace of its own so its providers
//! register with it. Its objects are told apart from roxe's by their
//! context: every verbs object (`ibv_pd`, `ibv_cq`, `ibv_qp`, `ibv_mr`,
//! `ibv_srq`, `ibv_ah`, `ibv_comp_channel`, ...) starts with its
//! `struct ibv_context *`, and the contexts the system library opened
//! through `ibv_open_device` are recorded here until `ibv_close_device`.
//! Devices: the system's `ibv_device*` pointers are those of the list it
//! returned once, kept for the process's life. The inline data path
//! (`ibv_post_send`, `ibv_poll_cq`, extended verbs) needs nothing: it
//! jumps through the real provider's ops table in the real context.
//!
//! Hidden with `ROXE_SYSTEM_DEVICES=0` or `ROXE_BACKEND=soft`;
//! `ROXE_BACKEND=hardware` lists only the system's devices.

use crate::abi::*;
use parking_lot::Mutex;
use roxe_verbs::hw::{self, BackendChoice};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The system library's device list, kept (never freed).
struct SystemList(Vec<usize>);

static LIST: OnceLock<SystemList> = OnceLock::new();
/// Contexts the system library opened, by address.
static CONTEXTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// Whether any is open: the check costs one load for programs that never
/// open a real device.
static ANY_OPEN: AtomicBool = AtomicBool::new(false);
/// Resolved entry points by name.
static SYMBOLS: Mutex<Option<HashMap<&'static str, usize>>> = Mutex::new(None);

/// Whether this copy of the library lives in the process's base link-map
/// namespace. A copy `dlmopen`ed elsewhere is playing the system library
/// for another copy (roxe over roxe, in tests) and must not pass through
/// again: it would load a third copy, and so on.
fn in_base_namespace() -> bool {
    /// glibc's `RTLD_DL_LINKMAP` (`<dlfcn.h>`).
    const RTLD_DL_LINKMAP: std::ffi::c_int = 2;
    // SAFETY: Dl_info is plain data; all-zero is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut map: *mut c_void = std::ptr::null_mut();
    // SAFETY: an address inside this library and valid out-pointers.
    let found = unsafe {
        libc::dladdr1(
            in_base_namespace as *const c_void,
            &mut info,
            &mut map,
            RTLD_DL_LINKMAP,
        )
    };
    if found == 0 || map.is_null() {
        return true;
    }
    let mut lmid: libc::Lmid_t = libc::LM_ID_BASE;
    // SAFETY: in glibc a link map is a valid dlinfo handle; lmid is the
    // out-value RTLD_DI_LMID writes.
    let rc = unsafe {
        libc::dlinfo(
            map,
            libc::RTLD_DI_LMID,
            (&mut lmid as *mut libc::Lmid_t).cast(),
        )
    };
    rc != 0 || lmid == libc::LM_ID_BASE
}

/// Whether `ROXE_SYSTEM_DEVICES` / `ROXE_BACKEND` let real devices in.
fn wanted() -> bool {
    if !in_base_namespace() {
        return false;
    }
    let hidden = std::env::var("ROXE_SYSTEM_DEVICES").is_ok_and(|v| {
        roxe_provider::driver::parse_switch("ROXE_SYSTEM_DEVICES", &v).is_ok_and(|on| !on)
    });
    !hidden && BackendChoice::from_env().is_ok_and(|c| c != BackendChoice::Soft)
}

/// Whether roxe's own devices are listed (all but `ROXE_BACKEND=hardware`;
/// always in a copy that plays the system library).
pub(crate) fn soft_wanted() -> bool {
    !in_base_namespace() || BackendChoice::from_env().is_ok_and(|c| c != BackendChoice::Hardware)
}

/// The system's `ibv_device*`s to list after roxe's (none where there is
/// no system library, it lists nothing, or they are hidden).
pub(crate) fn devices() -> &'static [usize] {
    &LIST
        .get_or_init(|| {
            if !wanted() {
                return SystemList(Vec::new());
            }
            let Ok(sys) = hw::system() else {
                return SystemList(Vec::new());
            };
            SystemList(
                sys.device_pointers()
                    .into_iter()
                    .map(|p| p as usize)
                    .collect(),
            )
        })
        .0
}

/// Whether `dev` is one of the system's devices.
pub(crate) fn is_system_device(dev: *const ibv_device) -> bool {
    !dev.is_null() && LIST.get().is_some_and(|l| l.0.contains(&(dev as usize)))
}

/// Whether `ctx` is a context the system library opened.
pub(crate) fn is_system_context(ctx: *const ibv_context) -> bool {
    ANY_OPEN.load(Ordering::Acquire) && !ctx.is_null() && CONTEXTS.lock().contains(&(ctx as usize))
}

/// Whether `obj` (a verbs object: its first member is its context) is of
/// a real device.
///
/// # Safety
/// `obj` is NULL or points to a live verbs object.
pub(crate) unsafe fn is_system_object<T>(obj: *const T) -> bool {
    if !ANY_OPEN.load(Ordering::Acquire) || obj.is_null() {
        return false;
    }
    // SAFETY: per the contract; every verbs object begins with
    // `struct ibv_context *context`.
    let ctx = unsafe { *obj.cast::<*const ibv_context>() };
    is_system_context(ctx)
}

/// Record a context the system library opened (or forget it on close).
pub(crate) fn track_context(ctx: *const ibv_context, open: bool) {
    let mut c = CONTEXTS.lock();
    if open {
        c.push(ctx as usize);
    } else {
        c.retain(|&p| p != ctx as usize);
    }
    ANY_OPEN.store(!c.is_empty(), Ordering::Release);
}

/// The system library's entry point `name`, as type `F` (a C function
/// pointer type with that function's signature).
pub(crate) fn symbol<F: Copy>(name: &'static str) -> Option<F> {
    const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
    let mut cache = SYMBOLS.lock();
    let map = cache.get_or_insert_with(HashMap::new);
    let addr = match map.get(name) {
        Some(&a) => a,
        None => {
            let p = hw::system().as_ref().ok()?.symbol(name)?;
            map.insert(name, p as usize);
            p as usize
        }
    };
    // SAFETY: F is a function pointer type of pointer size (asserted) and
    // the caller names it with the C signature of `name`.
    Some(unsafe { std::mem::transmute_copy::<usize, F>(&addr) })
}

/// Forward the enclosing verb to the system library when `$is_system`
/// holds: `pass_through!(cond, "ibv_x", fn(A, B) -> R, (a, b), missing)`;
/// `pass_through!(object obj, ...)` when `obj` (a verbs object) is of a
/// real device, `pass_through!(context ctx, ...)` when `ctx` is a context
/// the system library opened, `pass_through!(device dev, ...)` when `dev`
/// is one of its devices. `missing` is returned where the library lacks
/// the symbol.
macro_rules! pass_through {
    (context $ctx:expr, $name:literal, fn($($t:ty),*) -> $r:ty, ($($a:expr),*), $missing:expr) => {
        $crate::passthrough::pass_through!(
            $crate::passthrough::is_system_context($ctx),
            $name,
            fn($($t),*) -> $r,
            ($($a),*),
            $missing
        )
    };
    (device $dev:expr, $name:literal, fn($($t:ty),*) -> $r:ty, ($($a:expr),*), $missing:expr) => {
        $crate::passthrough::pass_through!(
            $crate::passthrough::is_system_device($dev),
            $name,
            fn($($t),*) -> $r,
            ($($a),*),
            $missing
        )
    };
    (object $obj:expr, $name:literal, fn($($t:ty),*) -> $r:ty, ($($a:expr),*), $missing:expr) => {
        $crate::passthrough::pass_through!(
            // SAFETY: the verb's C contract: its object argument is NULL or a
            // live verbs object (of this library or of the system's).
            unsafe { $crate::passthrough::is_system_object($obj) },
            $name,
            fn($($t),*) -> $r,
            ($($a),*),
            $missing
        )
    };
    ($is_system:expr, $name:literal, fn($($t:ty),*) -> $r:ty, ($($a:expr),*), $missing:expr) => {
        if $is_system {
            return match $crate::passthrough::symbol::<unsafe extern "C" fn($($t),*) -> $r>($name) {
                // SAFETY: the system library's function of the same name
                // and signature, with the caller's arguments unchanged.
                Some(f) => unsafe { f($($a),*) },
                None => $missing,
            };
        }
    };
}
pub(crate) use pass_through;
