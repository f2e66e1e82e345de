//! Sharing a context's objects with another context: `ibv_import_device`,
//! `ibv_import_pd`, `ibv_import_mr`, `ibv_import_dm` and the `unimport`s.
//!
//! In the kernel, the objects a context creates belong to its command file
//! (a uverbs fd, `context->cmd_fd`) and are named by handles; a context
//! imported from a `dup` of that fd shares the file, so it finds them by
//! handle. A soft context's command fd is a memfd of its own: one inode per
//! file, which every `dup` names. The contexts on one file share a
//! [`Handles`]; the registry below finds it by the fd's inode.
//!
//! As in the kernel, destroying an object through any of the structs that
//! name it destroys it (an MR is deregistered then: the memory is no longer
//! reachable by its keys, whichever struct the program still holds), and an
//! `unimport` only frees the struct.

use crate::abi::*;
use crate::context::{context, RoxeContext};
use crate::dm::RoxeDm;
use crate::mr::{MrSlot, RoxeMr};
use crate::object::{container_of, free, hand_out};
use crate::pd::RoxePd;
use crate::{fail_null, guard, last_errno};
use parking_lot::Mutex;
use roxe_verbs::{Context, Dm, Pd};
use std::collections::HashMap;
use std::ffi::c_int;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::null_mut;
use std::sync::{Arc, Weak};

/// A file's identity: (device, inode) of its `fstat`.
type FileKey = (u64, u64);

/// The objects of one command file, by handle (one numbering for all
/// kinds, as the kernel's per-file table).
pub(crate) struct Handles {
    key: FileKey,
    /// What an imported context opens: the device and its roxe context.
    device: usize,
    ctx: Context,
    objects: Mutex<Objects>,
}

#[derive(Default)]
struct Objects {
    last: u32,
    pds: HashMap<u32, Pd>,
    mrs: HashMap<u32, Arc<MrSlot>>,
    dms: HashMap<u32, Dm>,
}

/// Command files with live contexts, by inode.
static FILES: Mutex<Vec<(FileKey, Weak<Handles>)>> = Mutex::new(Vec::new());

fn file_key(fd: BorrowedFd<'_>) -> Result<FileKey, c_int> {
    // SAFETY: stat is plain data; all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open (borrowed) and st a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(last_errno());
    }
    Ok((st.st_dev, st.st_ino))
}

impl Handles {
    /// The table of a new command file `cmd_fd`, registered so that a
    /// context imported through a `dup` of it finds it.
    pub(crate) fn register(
        cmd_fd: BorrowedFd<'_>,
        device: *mut ibv_device,
        ctx: Context,
    ) -> Result<Arc<Self>, c_int> {
        let key = file_key(cmd_fd)?;
        let h = Arc::new(Handles {
            key,
            device: device as usize,
            ctx,
            objects: Mutex::default(),
        });
        let mut files = FILES.lock();
        files.retain(|(_, w)| w.strong_count() > 0);
        files.push((key, Arc::downgrade(&h)));
        Ok(h)
    }

    /// The table of the command file `fd` names, if it is a soft context's.
    fn of_fd(fd: BorrowedFd<'_>) -> Result<Option<Arc<Self>>, c_int> {
        let key = file_key(fd)?;
        Ok(FILES
            .lock()
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, w)| w.upgrade()))
    }

    fn add(&self, put: impl FnOnce(&mut Objects, u32)) -> u32 {
        let mut o = self.objects.lock();
        // Handles are u32 and never 0 here; a wrap skips those in use.
        let mut h = o.last;
        loop {
            h = h.wrapping_add(1).max(1);
            if !o.pds.contains_key(&h) && !o.mrs.contains_key(&h) && !o.dms.contains_key(&h) {
                break;
            }
        }
        o.last = h;
        put(&mut o, h);
        h
    }

    pub(crate) fn add_pd(&self, pd: &Pd) -> u32 {
        self.add(|o, h| {
            o.pds.insert(h, pd.clone());
        })
    }

    pub(crate) fn add_mr(&self, mr: &Arc<MrSlot>) -> u32 {
        self.add(|o, h| {
            o.mrs.insert(h, Arc::clone(mr));
        })
    }

    pub(crate) fn add_dm(&self, dm: &Dm) -> u32 {
        self.add(|o, h| {
            o.dms.insert(h, dm.clone());
        })
    }

    /// The object `handle` named is destroyed: it can no longer be imported.
    pub(crate) fn forget(&self, handle: u32) {
        let mut o = self.objects.lock();
        o.pds.remove(&handle);
        o.mrs.remove(&handle);
        o.dms.remove(&handle);
    }
}

impl std::fmt::Debug for Handles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handles").field("file", &self.key).finish()
    }
}

/// The handle table of the soft context `ctx`, if it is one.
///
/// # Safety
/// `ctx` is NULL or a live context of this library.
unsafe fn handles_of<'a>(ctx: *mut ibv_context) -> Option<&'a Arc<Handles>> {
    // SAFETY: per the contract.
    unsafe { context(ctx) }.map(|c: &RoxeContext| &c.handles)
}

/// The object a handle names on `ctx`'s command file, as `pick` finds it in
/// the table: EINVAL for a context that is none of this library's, ENOENT
/// for a handle that names no such object.
///
/// # Safety
/// `ctx` is NULL or a live context of this library.
unsafe fn imported<T>(
    ctx: *mut ibv_context,
    pick: impl FnOnce(&Objects) -> Option<T>,
) -> Result<T, c_int> {
    // SAFETY: per the contract.
    let h = unsafe { handles_of(ctx) }.ok_or(libc::EINVAL)?;
    let found = pick(&h.objects.lock());
    found.ok_or(libc::ENOENT)
}

/// Forget the object a destroyed struct named by `handle` on `ctx`'s
/// command file: it can no longer be imported. The 0 handle names nothing
/// (handles start at 1): parent domains and structs of no file.
pub(crate) fn forget_handle(ctx: *mut ibv_context, handle: u32) {
    if handle == 0 {
        return;
    }
    // SAFETY: an object's context outlives it (the C contract: contexts
    // are closed after their objects).
    if let Some(h) = unsafe { handles_of(ctx) } {
        h.forget(handle);
    }
}

/// `ibv_import_device`: a new context on the command file `cmd_fd` names,
/// sharing its objects; it owns `cmd_fd` from now on (closed by
/// `ibv_close_device`), as in libibverbs. A file that is not a soft
/// context's goes to the system library (a real device's uverbs fd).
///
/// # Safety
/// `cmd_fd` is an open descriptor the caller hands over on success.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    guard(null_mut(), || {
        if cmd_fd < 0 {
            return fail_null(libc::EBADF);
        }
        // SAFETY: cmd_fd is an open descriptor of the caller's (the C
        // contract), borrowed only for this call's fstat.
        let fd = unsafe { BorrowedFd::borrow_raw(cmd_fd) };
        let found = match Handles::of_fd(fd) {
            Ok(h) => h,
            Err(e) => return fail_null(e),
        };
        let Some(handles) = found else {
            if crate::passthrough::devices().is_empty() {
                return fail_null(libc::EOPNOTSUPP);
            }
            let import = crate::passthrough::symbol::<
                unsafe extern "C" fn(c_int) -> *mut ibv_context,
            >("ibv_import_device");
            let Some(f) = import else {
                return fail_null(libc::EOPNOTSUPP);
            };
            // SAFETY: the system library's ibv_import_device on the
            // caller's descriptor, as the caller asked.
            let ctx = unsafe { f(cmd_fd) };
            if ctx.is_null() {
                // errno is the system library's.
                return null_mut();
            }
            // Its verbs go to the system library from now on, as those of
            // a context `ibv_open_device` opened there.
            crate::passthrough::track_context(ctx, true);
            return ctx;
        };
        let device = handles.device as *mut ibv_device;
        let ctx = handles.ctx.clone();
        match crate::context::open_context(
            device,
            ctx,
            crate::context::CmdFile::Imported {
                fd: fd.as_raw_fd(),
                handles,
            },
        ) {
            Ok(c) => c,
            Err(e) => fail_null(e),
        }
    })
}

/// `ibv_import_pd`: the PD `handle` names on `ctx`'s command file, as a new
/// struct (ENOENT for a handle that names no PD).
///
/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(ctx: *mut ibv_context, handle: u32) -> *mut ibv_pd {
    crate::passthrough::pass_through!(
        context ctx,
        "ibv_import_pd",
        fn(*mut ibv_context, u32) -> *mut ibv_pd,
        (ctx, handle),
        null_mut()
    );
    guard(null_mut(), || {
        // SAFETY: ctx is NULL or an open context (the C contract).
        match unsafe { imported(ctx, |o| o.pds.get(&handle).cloned()) } {
            Ok(pd) => hand_out(RoxePd::new(ctx, handle, pd)).cast(),
            Err(e) => fail_null(e),
        }
    })
}

/// `ibv_unimport_pd`: frees the struct; the PD lives on.
///
/// # Safety
/// `pd` is NULL or a live PD struct, not used again.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(pd: *mut ibv_pd) {
    crate::passthrough::pass_through!(
        object pd,
        "ibv_unimport_pd",
        fn(*mut ibv_pd) -> (),
        (pd),
        ()
    );
    guard((), || {
        // SAFETY: pd is NULL or from this library (the C contract).
        let Some(p) = (unsafe { container_of::<RoxePd, _>(pd) }) else {
            return;
        };
        // Objects made through this struct point at it: while any lives the
        // struct is kept (a few bytes), so their destruction stays sound.
        if !p.users.in_use() {
            // SAFETY: pd came from hand_out(RoxePd) and is freed once.
            unsafe { free::<RoxePd, _>(pd) };
        }
    })
}

/// `ibv_import_mr`: the MR `handle` names on the command file of `pd`'s
/// context, as a new struct on `pd` (ENOENT for a handle that names no MR,
/// or one deregistered).
///
/// # Safety
/// `pd` is NULL or a live PD (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(pd: *mut ibv_pd, handle: u32) -> *mut ibv_mr {
    crate::passthrough::pass_through!(
        object pd,
        "ibv_import_mr",
        fn(*mut ibv_pd, u32) -> *mut ibv_mr,
        (pd, handle),
        null_mut()
    );
    guard(null_mut(), || {
        // SAFETY: pd is NULL or from this library (the C contract).
        let Some(p) = (unsafe { container_of::<RoxePd, _>(pd) }) else {
            return fail_null(libc::EINVAL);
        };
        let ctx = p.context();
        // SAFETY: a PD's context outlives it.
        let slot = match unsafe { imported(ctx, |o| o.mrs.get(&handle).cloned()) } {
            Ok(slot) => slot,
            Err(e) => return fail_null(e),
        };
        let Some(c) = slot.lock().as_ref().map(|mr| ibv_mr {
            context: ctx,
            pd,
            // The region's start as the kernel reports it (its iova).
            addr: mr.addr() as usize as *mut _,
            length: mr.len(),
            handle,
            lkey: mr.lkey(),
            rkey: mr.rkey(),
        }) else {
            return fail_null(libc::ENOENT);
        };
        hand_out(RoxeMr::new(c, slot, p)).cast()
    })
}

/// `ibv_unimport_mr`: frees the struct; the region stays registered.
///
/// # Safety
/// `mr` is NULL or a live MR struct, not used again.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(mr: *mut ibv_mr) {
    crate::passthrough::pass_through!(
        object mr,
        "ibv_unimport_mr",
        fn(*mut ibv_mr) -> (),
        (mr),
        ()
    );
    // SAFETY: mr is NULL or this library's (the C contract), freed once.
    guard((), || unsafe { free::<RoxeMr, _>(mr) })
}

/// `ibv_import_dm`: the device memory `handle` names on `ctx`'s command
/// file, as a new struct (ENOENT for a handle that names none).
///
/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's).
#[no_mangle]
pub unsafe extern "C" fn ibv_import_dm(ctx: *mut ibv_context, handle: u32) -> *mut ibv_dm {
    crate::passthrough::pass_through!(
        context ctx,
        "ibv_import_dm",
        fn(*mut ibv_context, u32) -> *mut ibv_dm,
        (ctx, handle),
        null_mut()
    );
    guard(null_mut(), || {
        // SAFETY: ctx is NULL or an open context (the C contract).
        match unsafe { imported(ctx, |o| o.dms.get(&handle).cloned()) } {
            Ok(dm) => hand_out(RoxeDm::new(ctx, handle, dm)).cast(),
            Err(e) => fail_null(e),
        }
    })
}

/// `ibv_unimport_dm`: frees the struct; the memory lives on.
///
/// # Safety
/// `dm` is NULL or a live device-memory struct, not used again.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(dm: *mut ibv_dm) {
    crate::passthrough::pass_through!(
        object dm,
        "ibv_unimport_dm",
        fn(*mut ibv_dm) -> (),
        (dm),
        ()
    );
    // SAFETY: dm is NULL or this library's (the C contract), freed once.
    guard((), || unsafe { free::<RoxeDm, _>(dm) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_that_is_no_context_is_not_imported() {
        let f = std::fs::File::open("/dev/null").expect("open /dev/null");
        // SAFETY: a live descriptor; on failure it is not taken.
        let c = unsafe { ibv_import_device(f.as_raw_fd()) };
        assert!(c.is_null());
        // SAFETY: -1 names no descriptor.
        assert!(unsafe { ibv_import_device(-1) }.is_null());
    }
}
