//! `libroxe_view.so`: `roxe run --view preload`, for machines where no
//! mount namespace can be made (unprivileged user namespaces forbidden, a
//! container without mounts). Preloaded into the program
//! (`LD_PRELOAD`), it sends the path-taking calls of the C library for
//! `/sys/class/infiniband*` and `/dev/infiniband*` to the same entries
//! written under `$ROXE_VIEW_ROOT` (`roxe run` writes them: files, and
//! symbolic links to `/dev/null` for the character devices), and passes
//! every other call through untouched. Only absolute paths are redirected;
//! what a program reaches by a relative path or a directory descriptor
//! is not (UCX, libfabric and rdma-core's tests use absolute paths).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// The prefixes sent to the view.
const REDIRECTED: [&[u8]; 2] = [b"/sys/class/infiniband", b"/dev/infiniband"];

/// `$ROXE_VIEW_ROOT`, read once (`None`: redirect nothing).
fn view_root() -> Option<&'static [u8]> {
    static ROOT: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    ROOT.get_or_init(|| {
        std::env::var_os("ROXE_VIEW_ROOT").map(|v| {
            use std::os::unix::ffi::OsStringExt;
            v.into_vec()
        })
    })
    .as_deref()
}

/// The path to use instead of `path`, when it is one the view holds.
fn redirect(root: &[u8], path: &[u8]) -> Option<CString> {
    let hit = REDIRECTED.iter().any(|p| {
        path.starts_with(p) && matches!(path.get(p.len()), None | Some(b'/') | Some(b'_'))
    });
    if !hit {
        return None;
    }
    let mut v = Vec::with_capacity(root.len() + path.len());
    v.extend_from_slice(root);
    v.extend_from_slice(path);
    CString::new(v).ok()
}

/// Call `f` with `path`, or with its place in the view.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
unsafe fn with_path<R>(path: *const c_char, f: impl FnOnce(*const c_char) -> R) -> R {
    if path.is_null() {
        return f(path);
    }
    let Some(root) = view_root() else {
        return f(path);
    };
    // SAFETY: a non-NULL path is NUL-terminated (the caller's contract).
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    match redirect(root, bytes) {
        Some(p) => f(p.as_ptr()),
        None => f(path),
    }
}

/// The C library's own `name` (the next definition after this library's).
fn next(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) }
}

/// The next definition of `name` (cached in `cache`), or `None` with errno
/// `ENOSYS` when there is none.
fn real(cache: &OnceLock<usize>, name: &str) -> Option<usize> {
    let real = *cache.get_or_init(|| CString::new(name).map_or(0, |n| next(&n) as usize));
    if real == 0 {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return None;
    }
    Some(real)
}

/// Define interposers that pass their path (`@path`, after the arguments
/// listed before it) through [`with_path`] and call the next definition,
/// failing with ENOSYS when there is none.
macro_rules! interpose {
    ($( $name:ident ( $($pre:ident : $pty:ty,)* @path $(, $arg:ident : $ty:ty)* ) -> $ret:ty = $fail:expr; )*) => {$(
        /// Interposed: see the crate documentation.
        ///
        /// # Safety
        /// As the C library's function of the same name.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($pre: $pty,)* path: *const c_char $(, $arg: $ty)*) -> $ret {
            type F = unsafe extern "C" fn($($pty,)* *const c_char $(, $ty)*) -> $ret;
            static REAL: OnceLock<usize> = OnceLock::new();
            let Some(real) = real(&REAL, stringify!($name)) else {
                return $fail;
            };
            // SAFETY: `real` is the C library's function of this name and type.
            let real: F = unsafe { std::mem::transmute::<usize, F>(real) };
            // SAFETY: the arguments are the caller's, passed on unchanged.
            unsafe { with_path(path, |p| real($($pre,)* p $(, $arg)*)) }
        }
    )*};
}

// `open`'s mode is variadic in C; it is read (and passed on) as a fixed
// third argument, which is what the x86_64 and aarch64 calling conventions
// make of it: garbage the callee ignores unless O_CREAT or O_TMPFILE.
interpose! {
    open(@path, flags: c_int, mode: libc::mode_t) -> c_int = -1;
    open64(@path, flags: c_int, mode: libc::mode_t) -> c_int = -1;
    __open_2(@path, flags: c_int) -> c_int = -1;
    __open64_2(@path, flags: c_int) -> c_int = -1;
    fopen(@path, mode: *const c_char) -> *mut libc::FILE = std::ptr::null_mut();
    fopen64(@path, mode: *const c_char) -> *mut libc::FILE = std::ptr::null_mut();
    stat(@path, buf: *mut libc::stat) -> c_int = -1;
    stat64(@path, buf: *mut libc::stat64) -> c_int = -1;
    lstat(@path, buf: *mut libc::stat) -> c_int = -1;
    lstat64(@path, buf: *mut libc::stat64) -> c_int = -1;
    access(@path, mode: c_int) -> c_int = -1;
    opendir(@path) -> *mut libc::DIR = std::ptr::null_mut();
    readlink(@path, buf: *mut c_char, len: libc::size_t) -> libc::ssize_t = -1;
    realpath(@path, resolved: *mut c_char) -> *mut c_char = std::ptr::null_mut();
    // The `*at` calls: the path after a directory descriptor.
    openat(dirfd: c_int, @path, flags: c_int, mode: libc::mode_t) -> c_int = -1;
    openat64(dirfd: c_int, @path, flags: c_int, mode: libc::mode_t) -> c_int = -1;
    __openat_2(dirfd: c_int, @path, flags: c_int) -> c_int = -1;
    __openat64_2(dirfd: c_int, @path, flags: c_int) -> c_int = -1;
    fstatat(dirfd: c_int, @path, buf: *mut libc::stat, flags: c_int) -> c_int = -1;
    fstatat64(dirfd: c_int, @path, buf: *mut libc::stat64, flags: c_int) -> c_int = -1;
    faccessat(dirfd: c_int, @path, mode: c_int, flags: c_int) -> c_int = -1;
    statx(dirfd: c_int, @path, flags: c_int, mask: libc::c_uint, buf: *mut libc::statx) -> c_int = -1;
    readlinkat(dirfd: c_int, @path, buf: *mut c_char, len: libc::size_t) -> libc::ssize_t = -1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_rdma_paths_move() {
        let r = b"/run/v";
        let moved = |p: &str| redirect(r, p.as_bytes()).map(|c| c.into_string().unwrap());
        assert_eq!(
            moved("/sys/class/infiniband/roxe0/ports/1/gids/0").as_deref(),
            Some("/run/v/sys/class/infiniband/roxe0/ports/1/gids/0")
        );
        assert_eq!(
            moved("/sys/class/infiniband_verbs/uverbs0/ibdev").as_deref(),
            Some("/run/v/sys/class/infiniband_verbs/uverbs0/ibdev")
        );
        assert_eq!(
            moved("/dev/infiniband").as_deref(),
            Some("/run/v/dev/infiniband")
        );
        assert_eq!(
            moved("/dev/infiniband/rdma_cm").as_deref(),
            Some("/run/v/dev/infiniband/rdma_cm")
        );
        for kept in [
            "/sys/class/net/lo",
            "/dev/null",
            "/sys/class/infinibandx",
            "infiniband",
            "/dev/infinibandy",
        ] {
            assert_eq!(moved(kept), None, "{kept}");
        }
    }
}
