//! The system's libibverbs, for the hardware backend: found, loaded at run
//! time, and asked for the real RDMA devices.
//!
//! Which file: `ROXE_SYSTEM_LIBIBVERBS=/path`, else the `libibverbs.so.1`
//! the linker cache (`ldconfig -p`) names, else the first of the standard
//! library directories that has one. Never roxe's own drop-in (recognised
//! by the marker string it carries), whatever `LD_LIBRARY_PATH` says.
//!
//! How: `dlmopen` into a new link-map namespace. In a process that runs on
//! roxe's drop-in, the name `libibverbs.so.1` is already taken by the
//! drop-in; the providers the system library loads (`libmlx5`, `librxe`)
//! would bind their `verbs_register_driver_34` to it and register with
//! the wrong library. In its own namespace the system library and its
//! providers resolve among themselves.
//!
//! Opening a device gives the objects of `objects` (context, PD, CQ,
//! channel, QP, MR, SRQ, AH over the real calls), which the public types
//! hold as their hardware side (`Backed::Hw`, in `backend.rs`): no generic
//! parameter reaches user code.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The string every build of roxe's drop-in `libibverbs.so.1` carries
/// (`verbs-api/capi/src/lib.rs`), so the loader never takes it for the
/// system's.
pub const DROP_IN_MARKER: &str = "roxe drop-in libibverbs: not the system library";

/// Where the system library is looked for after `ROXE_SYSTEM_LIBIBVERBS`
/// and the linker cache.
const STANDARD_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/lib",
];

use crate::abi::*;
use std::ffi::c_uint;

mod objects;
pub(crate) use objects::{HwAh, HwChannel, HwContext, HwCq, HwMr, HwPd, HwQp, HwSrq};

/// Declares the entry points used, by their C names and signatures
/// (`infiniband/verbs.h`); `opt` ones may be missing from older libraries.
macro_rules! entry_points {
    (req { $($f:ident = $n:literal : $t:ty,)* } opt { $($of:ident = $on:literal : $ot:ty,)* }) => {
        /// The system library's entry points.
        pub(crate) struct Fns {
            $(pub(crate) $f: $t,)*
            $(pub(crate) $of: Option<$ot>,)*
        }
        impl Fns {
            fn load(sym: impl Fn(&str) -> Option<*mut c_void>, path: &Path) -> Result<Fns, String> {
                Ok(Fns {
                    $($f: {
                        let p = sym($n).ok_or_else(|| format!("{}: no symbol {}", path.display(), $n))?;
                        // SAFETY: the symbol is the libibverbs function of
                        // that name, whose C signature the type states.
                        unsafe { std::mem::transmute::<*mut c_void, $t>(p) }
                    },)*
                    // SAFETY: as above.
                    $($of: sym($on).map(|p| unsafe { std::mem::transmute::<*mut c_void, $ot>(p) }),)*
                })
            }
        }
    };
}

entry_points! {
    req {
        get_device_list = "ibv_get_device_list": unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void,
        free_device_list = "ibv_free_device_list": unsafe extern "C" fn(*mut *mut c_void),
        get_device_name = "ibv_get_device_name": unsafe extern "C" fn(*mut c_void) -> *const c_char,
        get_device_guid = "ibv_get_device_guid": unsafe extern "C" fn(*mut c_void) -> u64,
        open_device = "ibv_open_device": unsafe extern "C" fn(*mut c_void) -> *mut c_void,
        close_device = "ibv_close_device": unsafe extern "C" fn(*mut ibv_context) -> c_int,
        query_device = "ibv_query_device": unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
        query_port = "ibv_query_port": unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
        query_gid = "ibv_query_gid": unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
        alloc_pd = "ibv_alloc_pd": unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
        dealloc_pd = "ibv_dealloc_pd": unsafe extern "C" fn(*mut ibv_pd) -> c_int,
        reg_mr = "ibv_reg_mr": unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
        dereg_mr = "ibv_dereg_mr": unsafe extern "C" fn(*mut ibv_mr) -> c_int,
        create_comp_channel = "ibv_create_comp_channel": unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
        destroy_comp_channel = "ibv_destroy_comp_channel": unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
        create_cq = "ibv_create_cq": unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq,
        destroy_cq = "ibv_destroy_cq": unsafe extern "C" fn(*mut ibv_cq) -> c_int,
        get_cq_event = "ibv_get_cq_event": unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
        ack_cq_events = "ibv_ack_cq_events": unsafe extern "C" fn(*mut ibv_cq, c_uint),
        create_qp = "ibv_create_qp": unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
        modify_qp = "ibv_modify_qp": unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
        query_qp = "ibv_query_qp": unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int,
        destroy_qp = "ibv_destroy_qp": unsafe extern "C" fn(*mut ibv_qp) -> c_int,
        create_srq = "ibv_create_srq": unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq,
        destroy_srq = "ibv_destroy_srq": unsafe extern "C" fn(*mut ibv_srq) -> c_int,
        create_ah = "ibv_create_ah": unsafe extern "C" fn(*mut ibv_pd, *mut ibv_ah_attr) -> *mut ibv_ah,
        destroy_ah = "ibv_destroy_ah": unsafe extern "C" fn(*mut ibv_ah) -> c_int,
        get_async_event = "ibv_get_async_event": unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
        ack_async_event = "ibv_ack_async_event": unsafe extern "C" fn(*mut ibv_async_event),
    }
    opt {
        reg_mr_iova = "ibv_reg_mr_iova": unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr,
        query_gid_ex = "_ibv_query_gid_ex": unsafe extern "C" fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int,
    }
}

/// The loaded system library: its path and the entry points used.
pub struct SystemVerbs {
    path: PathBuf,
    /// The dlmopen handle (never closed).
    handle: usize,
    pub(crate) fns: Fns,
}

impl std::fmt::Debug for SystemVerbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemVerbs")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A real device the system library lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HardwareDevice {
    /// `mlx5_0`, `rxe0`, ...
    pub name: String,
    /// Node GUID (host byte order).
    pub guid: u64,
}

impl SystemVerbs {
    /// The file loaded.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Any entry point of the library by name (the drop-in forwards the
    /// verbs of real devices through these).
    pub fn symbol(&self, name: &str) -> Option<*mut c_void> {
        let c = CString::new(name).ok()?;
        // SAFETY: dlsym on the live handle with a valid C string.
        let p = unsafe { libc::dlsym(self.handle as *mut c_void, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    /// The library's `struct ibv_device *`s, from a list that is never
    /// freed (so they stay valid for the process's life, as the drop-in
    /// hands them to programs).
    pub fn device_pointers(&self) -> Vec<*mut c_void> {
        let mut n: c_int = 0;
        // SAFETY: as in each_device; the list is deliberately kept.
        let list = unsafe { (self.fns.get_device_list)(&mut n) };
        if list.is_null() {
            return Vec::new();
        }
        (0..usize::try_from(n).unwrap_or(0))
            // SAFETY: i < n entries of the list.
            .map(|i| unsafe { *list.add(i) })
            .collect()
    }

    /// Run `f` over the system's device list (each `struct ibv_device*`);
    /// the list is freed afterwards.
    fn each_device<R>(&self, mut f: impl FnMut(*mut c_void) -> Option<R>) -> Option<R> {
        let mut n: c_int = 0;
        // SAFETY: the system library's ibv_get_device_list with a valid
        // out-pointer; it returns NULL or an array of n device pointers.
        let list = unsafe { (self.fns.get_device_list)(&mut n) };
        if list.is_null() {
            return None;
        }
        let mut found = None;
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: i < n entries of the list just returned.
            let dev = unsafe { *list.add(i) };
            if let Some(r) = f(dev) {
                found = Some(r);
                break;
            }
        }
        // SAFETY: the list from get_device_list, freed once.
        unsafe { (self.fns.free_device_list)(list) };
        found
    }

    /// `f` of the device named `name` while the list is alive.
    pub(crate) fn with_device<R>(&self, name: &str, f: impl FnOnce(*mut c_void) -> R) -> Option<R> {
        let mut f = Some(f);
        self.each_device(|dev| {
            (objects::device_name(self, dev).as_deref() == Some(name))
                .then(|| f.take().map(|f| f(dev)))
                .flatten()
        })
    }

    /// `ibv_get_device_list` of the system library, names and GUIDs.
    pub fn devices(&self) -> Vec<HardwareDevice> {
        let mut out = Vec::new();
        self.each_device::<()>(|dev| {
            if let Some(name) = objects::device_name(self, dev) {
                out.push(HardwareDevice {
                    name,
                    // SAFETY: dev is of the live list; the GUID comes in
                    // network byte order.
                    guid: u64::from_be(unsafe { (self.fns.get_device_guid)(dev) }),
                });
            }
            None
        });
        out
    }
}

/// The system library, loaded on first use; Err says in one line why
/// there is none.
pub fn system() -> &'static Result<SystemVerbs, String> {
    static SYSTEM: OnceLock<Result<SystemVerbs, String>> = OnceLock::new();
    SYSTEM.get_or_init(|| {
        let allow_drop_in = std::env::var("ROXE_HW_ALLOW_DROP_IN").is_ok_and(|v| v == "1");
        let path = find(
            std::env::var_os("ROXE_SYSTEM_LIBIBVERBS").map(PathBuf::from),
            &linker_cache(),
            allow_drop_in,
        )?;
        load(&path)
    })
}

/// Which file to load: the override, else the cache's entries, else the
/// standard directories; roxe's drop-in is skipped (and refused when it is
/// the override, unless `allow_drop_in`: the tests' roxe-over-roxe, where
/// a second copy of the drop-in in its own namespace plays the system
/// library and its soft devices play real ones, through the C ABI).
pub fn find(
    override_path: Option<PathBuf>,
    cache: &[PathBuf],
    allow_drop_in: bool,
) -> Result<PathBuf, String> {
    if let Some(p) = override_path {
        if !p.is_file() {
            return Err(format!(
                "ROXE_SYSTEM_LIBIBVERBS={}: no such file",
                p.display()
            ));
        }
        if !allow_drop_in && is_drop_in(&p) {
            return Err(format!(
                "ROXE_SYSTEM_LIBIBVERBS={} is roxe's own drop-in library",
                p.display()
            ));
        }
        return Ok(p);
    }
    let standard = STANDARD_DIRS
        .iter()
        .map(|d| Path::new(d).join("libibverbs.so.1"));
    cache
        .iter()
        .cloned()
        .chain(standard)
        .find(|p| p.is_file() && !is_drop_in(p))
        .ok_or_else(|| {
            "no system libibverbs.so.1 (install libibverbs1, or set ROXE_SYSTEM_LIBIBVERBS)"
                .to_string()
        })
}

/// The `libibverbs.so.1` paths `ldconfig -p` prints, in its order.
fn linker_cache() -> Vec<PathBuf> {
    ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|l| std::process::Command::new(l).arg("-p").output().ok())
        .map(|out| parse_ldconfig(&String::from_utf8_lossy(&out.stdout)))
        .unwrap_or_default()
}

/// `\tlibibverbs.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libibverbs.so.1`
pub fn parse_ldconfig(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|l| {
            let (lhs, path) = l.split_once("=>")?;
            (lhs.split_whitespace().next()? == "libibverbs.so.1")
                .then(|| PathBuf::from(path.trim()))
        })
        .collect()
}

/// Whether `path` is a build of roxe's drop-in (it carries the marker).
pub fn is_drop_in(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|bytes| {
        bytes
            .windows(DROP_IN_MARKER.len())
            .any(|w| w == DROP_IN_MARKER.as_bytes())
    })
}

/// dlmopen `path` into a namespace of its own and find the entry points.
fn load(path: &Path) -> Result<SystemVerbs, String> {
    let c_path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{}: a path with a NUL byte", path.display()))?;
    // SAFETY: dlmopen with a valid C string; LM_ID_NEWLM asks for a new
    // namespace. The handle is never closed (the library stays loaded for
    // the process's life, as a linked libibverbs would).
    let handle = unsafe {
        libc::dlmopen(
            libc::LM_ID_NEWLM,
            c_path.as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
    };
    if handle.is_null() {
        return Err(format!("cannot load {}: {}", path.display(), dlerror()));
    }
    let sym = |name: &str| -> Option<*mut c_void> {
        let c = CString::new(name).ok()?;
        // SAFETY: dlsym on the live handle with a valid C string.
        let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    };
    Ok(SystemVerbs {
        path: path.to_path_buf(),
        handle: handle as usize,
        fns: Fns::load(sym, path)?,
    })
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message valid until
    // the next dl* call on this thread.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// `ROXE_BACKEND`: which devices [`crate::devices`] offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// roxe's soft devices only.
    Soft,
    /// The system's RDMA devices only.
    Hardware,
    /// Soft devices first, then the system's (the default).
    Auto,
}

impl BackendChoice {
    /// Parse `ROXE_BACKEND` (unset or empty: auto).
    pub fn parse(v: Option<&str>) -> Result<BackendChoice, String> {
        match v.map(str::trim) {
            None | Some("") | Some("auto") => Ok(BackendChoice::Auto),
            Some("soft") => Ok(BackendChoice::Soft),
            Some("hardware") | Some("hw") => Ok(BackendChoice::Hardware),
            Some(other) => Err(format!(
                "ROXE_BACKEND={other:?}: expected soft, hardware or auto"
            )),
        }
    }

    /// From the environment.
    pub fn from_env() -> Result<BackendChoice, String> {
        BackendChoice::parse(std::env::var("ROXE_BACKEND").ok().as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_choice_parses() {
        assert_eq!(BackendChoice::parse(None), Ok(BackendChoice::Auto));
        assert_eq!(BackendChoice::parse(Some("")), Ok(BackendChoice::Auto));
        assert_eq!(BackendChoice::parse(Some("soft")), Ok(BackendChoice::Soft));
        assert_eq!(
            BackendChoice::parse(Some("hardware")),
            Ok(BackendChoice::Hardware)
        );
        assert!(BackendChoice::parse(Some("mlx5")).is_err());
    }

    #[test]
    fn ldconfig_output_parses() {
        let text = "1234 libs found in cache `/etc/ld.so.cache'\n\
            \tlibibverbs.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libibverbs.so.1\n\
            \tlibibverbs.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libibverbs.so\n\
            \tlibrdmacm.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/librdmacm.so.1\n";
        assert_eq!(
            parse_ldconfig(text),
            [PathBuf::from("/usr/lib/x86_64-linux-gnu/libibverbs.so.1")]
        );
    }

    #[test]
    fn a_missing_override_is_one_clear_line() {
        let e = find(Some("/nonexistent/libibverbs.so.1".into()), &[], false).unwrap_err();
        assert!(
            e.contains("ROXE_SYSTEM_LIBIBVERBS") && e.contains("no such file"),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn the_drop_in_is_never_taken_for_the_system_library() {
        let dir = std::env::temp_dir().join(format!("roxe-hw-find-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("libibverbs.so.1");
        std::fs::write(&fake, format!("\x7fELF ... {DROP_IN_MARKER} ...")).unwrap();
        let e = find(Some(fake.clone()), &[], false).unwrap_err();
        assert!(e.contains("roxe's own drop-in"), "{e}");
        // In the cache it is skipped for the next candidate.
        let real = dir.join("real.so");
        std::fs::write(&real, b"\x7fELF a system library").unwrap();
        assert_eq!(find(None, &[fake.clone(), real.clone()], true), Ok(real));
        // Only an explicit override may name it, and only when allowed.
        assert_eq!(find(Some(fake.clone()), &[], true), Ok(fake));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn loading_a_file_that_is_not_a_library_fails_cleanly() {
        let dir = std::env::temp_dir().join(format!("roxe-hw-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bogus = dir.join("libibverbs.so.1");
        std::fs::write(&bogus, b"not an ELF file").unwrap();
        let e = load(&bogus).unwrap_err();
        assert!(e.starts_with("cannot load"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Where the system library is installed (as in CI), it loads into its
    /// own namespace and lists whatever devices the machine has (none on
    /// a machine without RDMA hardware or rxe) without failing.
    #[test]
    fn the_installed_system_library_loads_and_lists() {
        let Ok(path) = find(None, &linker_cache(), false) else {
            println!("skipped: no system libibverbs.so.1");
            return;
        };
        let sys = load(&path).unwrap();
        let devs = sys.devices();
        println!(
            "{}: {} device(s): {devs:?}",
            sys.path().display(),
            devs.len()
        );
    }
}
