//! How a verbs object of this library is laid out, handed to C, found
//! again, counted and destroyed.
//!
//! Each object is a `#[repr(C)]` container whose first member is the
//! public struct the program reads (`ibv_pd`, `ibv_cq`, ...), followed by
//! roxe's handle and the library's own state. The pointer handed out is
//! the container's ([`hand_out`]), so a cast recovers it
//! ([`container_of`]).
//!
//! An object that others use counts its users ([`Users`]) and refuses to
//! be destroyed while any is left (EBUSY), as the kernel does: a PD is used
//! by the MRs, windows, SRQs, QPs and AHs made on it (and by a parent
//! domain standing for it), a CQ by its QPs and XRC or tag-matching SRQs,
//! an SRQ by its QPs, an XRC domain by its SRQs and XRC_RECV QPs. The user
//! holds a [`Used`], which counts it until the user's container is freed.
//! Every destroy verb is [`destroy`].

use crate::guard;
use libc::{pthread_cond_t, pthread_mutex_t};
use std::ffi::c_int;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Hand a container to C: its address is the public struct's (its first
/// member). Freed by [`destroy`] or [`free`].
pub(crate) fn hand_out<T>(container: T) -> *mut T {
    Box::into_raw(Box::new(container))
}

/// The container behind a public pointer this library handed out; `None`
/// for NULL.
///
/// # Safety
/// `p` must be NULL or the public struct (first member) of a live `T` from
/// [`hand_out`] that stays live for `'a`.
pub(crate) unsafe fn container_of<'a, T, C>(p: *mut C) -> Option<&'a T> {
    // SAFETY: per the contract, p is NULL or the first member, hence the
    // address, of a live T.
    unsafe { p.cast::<T>().as_ref() }
}

/// Free a container from [`hand_out`] (nothing for NULL): its fields are
/// dropped, releasing the objects it used.
///
/// # Safety
/// `p` must be NULL or the public struct of a live `T` from [`hand_out`],
/// not used again afterwards (no reference to it outlives this call).
pub(crate) unsafe fn free<T, C>(p: *mut C) {
    if !p.is_null() {
        // SAFETY: per the contract, p is a Box<T>'s pointer, freed once.
        drop(unsafe { Box::from_raw(p.cast::<T>()) });
    }
}

/// A destroy verb (`ibv_dealloc_pd`, `ibv_dereg_mr`, `ibv_destroy_cq`,
/// ...): EINVAL for NULL; `retire` either refuses with an errno (EBUSY
/// while the object is in use) or takes the object's last steps (forget
/// its handle, leave its channel, ...), after which the container is
/// freed, releasing the objects it used. 0 on success; a panic is EIO.
///
/// # Safety
/// `p` must be NULL or the public struct of a live `T` from [`hand_out`];
/// once this returns 0 the program does not use it again (the C
/// contract of every destroy verb).
pub(crate) unsafe fn destroy<T, C>(
    p: *mut C,
    retire: impl FnOnce(&T) -> Result<(), c_int>,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let Some(obj) = (unsafe { container_of::<T, C>(p) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = retire(obj) {
            return e;
        }
        // SAFETY: per the contract, a live container freed once; `obj` is
        // not used past this point.
        unsafe { free::<T, C>(p) };
        0
    })
}

/// How many objects use this one (see the module documentation).
#[derive(Default)]
pub(crate) struct Users(AtomicUsize);

impl Users {
    /// Whether any user is left.
    pub(crate) fn in_use(&self) -> bool {
        self.0.load(Ordering::Acquire) != 0
    }

    /// A destroy verb's refusal: EBUSY while any user is left.
    pub(crate) fn refuse_if_used(&self) -> Result<(), c_int> {
        if self.in_use() {
            Err(libc::EBUSY)
        } else {
            Ok(())
        }
    }
}

/// An object that counts its users and refuses to go while it has any.
pub(crate) trait Counted {
    fn users(&self) -> &Users;
}

/// One object's use of another: counted from [`Used::new`] until it is
/// dropped (with the user's container). The used object refuses to be
/// destroyed while counted, so it outlives every `Used` of it.
pub(crate) struct Used<T: Counted>(NonNull<T>);

impl<T: Counted> Used<T> {
    /// Count a use of `target`.
    pub(crate) fn new(target: &T) -> Self {
        target.users().0.fetch_add(1, Ordering::AcqRel);
        Used(NonNull::from(target))
    }
}

impl<T: Counted> Deref for Used<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the target counts this use, so it is not destroyed (nor
        // its struct freed, see `ibv_unimport_pd`) while this lives.
        unsafe { self.0.as_ref() }
    }
}

impl<T: Counted> Drop for Used<T> {
    fn drop(&mut self) {
        self.users().0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Acknowledge `n` events as libibverbs does (`ibv_ack_cq_events`,
/// `ibv_ack_async_event`): add them to the object's counter under its
/// `mutex` and wake whoever waits on its `cond`.
///
/// # Safety
/// The three pointers are members of one live verbs object whose mutex
/// and condition variable are initialised.
pub(crate) unsafe fn count_acked_events(
    mutex: *mut pthread_mutex_t,
    cond: *mut pthread_cond_t,
    completed: *mut u32,
    n: u32,
) {
    // SAFETY: per the contract; the counter is written under the mutex,
    // as libibverbs and the program's destroy path expect.
    unsafe {
        libc::pthread_mutex_lock(mutex);
        *completed = (*completed).wrapping_add(n);
        libc::pthread_cond_signal(cond);
        libc::pthread_mutex_unlock(mutex);
    }
}

/// Wait until the object's acknowledged events reach `handed_out`, as a
/// libibverbs destroy verb does: [`count_acked_events`] counts them under
/// the same `mutex` and signals the same `cond`.
///
/// # Safety
/// As for [`count_acked_events`].
pub(crate) unsafe fn wait_for_acked_events(
    mutex: *mut pthread_mutex_t,
    cond: *mut pthread_cond_t,
    completed: *const u32,
    handed_out: u32,
) {
    // SAFETY: per the contract; the counter is read under the mutex its
    // writer holds, afresh after each wait (another thread writes it).
    unsafe {
        libc::pthread_mutex_lock(mutex);
        while completed.read_volatile() != handed_out {
            libc::pthread_cond_wait(cond, mutex);
        }
        libc::pthread_mutex_unlock(mutex);
    }
}
