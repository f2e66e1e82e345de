//! Registered memory: the one place through which any byte of a memory
//! region is read or written, by the network (remote keys, responder side)
//! or by local work requests (local keys: requester gather, receive scatter,
//! READ-response and atomic-result placement).
//!
//! Every access names a key, the protection domain of the QP it comes
//! through, the access right it needs and an address range; the table
//! checks all four, with checked arithmetic, before touching a byte.
//!
//! # Keys
//!
//! Keys are built like rxe's: `index << 8 | key_byte`. Indices run from 1
//! (so key 0 is never valid) and are handed out cyclically, as rxe's pool
//! does (`xa_alloc_cyclic`), so a freed index is reused as late as
//! possible; the key byte is random (rxe: `get_random_u32() & 0xff`) and
//! never the byte that index had last, so a peer cannot predict a key from
//! the ones it saw, and a stale key (kept across a deregistration) never
//! names the region that next takes its index. `lkey == rkey`, as in rxe.
//!
//! # Concurrency and deregistration
//!
//! The engine is single-threaded: every access and every deregistration
//! goes through this table, writes and deregistration through `&mut self`,
//! so no access can be in flight while [`MemoryTable::deregister`] runs, and
//! once it has returned no key of the region resolves any more. A future
//! multi-threaded engine would put a per-region lock (or reference count)
//! in the private `Region` and take it in the private lookup; the public
//! API needs no change. The table is `Send` (the engine runs on a progress
//! thread) but not `Sync`.
//!
//! # Memory
//!
//! Every region is a raw pointer and a length. Owned regions
//! ([`MemoryTable::register_owned`]) are zeroed, 8-byte aligned heap buffers
//! the table allocates and frees; raw regions
//! ([`MemoryTable::register_raw`]) are the caller's memory, which the
//! application may change at any time, so the table never makes a Rust
//! reference to it: bytes move with `ptr::copy_nonoverlapping` and atomics
//! use `AtomicU64::from_ptr`, each in one small `unsafe` block right after
//! its range check.

use rustc_hash::FxHashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::types::{AccessFlags, Errno, PdId, VerbsError};

/// Default limit on live regions (rxe's historical `RXE_MAX_MR`, 256 Ki).
pub const MAX_REGIONS: u32 = 256 * 1024;

/// The largest region index a key can hold (24 bits above the key byte).
const MAX_KEY_INDEX: u32 = (1 << 24) - 1;

const VERB_REG: &str = "ibv_reg_mr";
const VERB_DEREG: &str = "ibv_dereg_mr";
const VERB_REREG: &str = "ibv_rereg_mr";

/// Access bits a registration may carry.
const SUPPORTED_ACCESS: u32 = AccessFlags::LOCAL_WRITE.0
    | AccessFlags::REMOTE_WRITE.0
    | AccessFlags::REMOTE_READ.0
    | AccessFlags::REMOTE_ATOMIC.0
    | AccessFlags::MW_BIND.0
    | AccessFlags::ZERO_BASED.0
    | AccessFlags::HUGETLB.0;

/// `IBV_ACCESS_OPTIONAL_RANGE`: bits a provider ignores when it does not
/// know them (libibverbs clears them for such providers).
const OPTIONAL_ACCESS_RANGE: u32 = 0x3ff0_0000;

/// A memory region's keys and extent as the verbs see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    /// Local key (for SGEs of local work requests).
    pub lkey: u32,
    /// Remote key (for RETH / AtomicETH of incoming requests); equals `lkey`.
    pub rkey: u32,
    /// The first virtual address of the region as work requests and the
    /// remote side name it (the iova): the buffer's address for owned
    /// regions, the caller's choice for raw ones, 0 with `ZERO_BASED`.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// Access rights granted (optional-range bits roxe does not know are
    /// dropped).
    pub access: AccessFlags,
    /// The protection domain the region belongs to.
    pub pd: PdId,
}

/// Why a memory access was refused (maps to NAK codes / WC statuses in the
/// engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No live region has this key (includes key 0 and stale keys).
    #[error("no such key")]
    BadKey,
    /// The key's region belongs to another protection domain.
    #[error("key belongs to another protection domain")]
    WrongPd,
    /// The region does not grant the needed access right.
    #[error("access right missing")]
    NoPermission,
    /// The range is not inside the region (or its arithmetic overflows), or
    /// a gather/scatter runs past the end of its SGE list.
    #[error("range outside the region")]
    OutOfRange,
    /// An atomic's target is not 8-byte aligned (in the iova, or in host
    /// memory for a raw region whose iova and pointer differ modulo 8).
    #[error("atomic target not 8-byte aligned")]
    Misaligned,
    /// A type 2 memory window bound to another QP.
    #[error("memory window bound to another QP")]
    WrongQp,
    /// An on-demand-paging region's page is not mapped (or not writable)
    /// in the process now.
    #[error("page not mapped")]
    Unmapped,
}

/// Who makes a remote access: the protection domain of the QP a request
/// came in on, and the QP (a type 2 memory window answers only the QP it
/// was bound through). A bare [`PdId`] is a QP of that PD that no type 2
/// window accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteQp {
    /// The QP's protection domain.
    pub pd: PdId,
    /// The QP's number.
    pub qpn: Option<u32>,
}

impl From<PdId> for RemoteQp {
    fn from(pd: PdId) -> RemoteQp {
        RemoteQp { pd, qpn: None }
    }
}

/// The two memory window types (`enum ibv_mw_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    /// Bound with `ibv_bind_mw`, to any QP of its PD; unbound by a
    /// zero-length bind; never invalidated.
    Type1 = 1,
    /// Bound with an `IBV_WR_BIND_MW` work request, to the QP that posted
    /// it; invalidated by LOCAL_INV or a SEND_WITH_INV on that QP.
    Type2 = 2,
}

/// A bind of a memory window to part of a memory region
/// (`struct ibv_mw_bind_info` with the window and its new key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The window's current key (its index names the window).
    pub mw_rkey: u32,
    /// The key the window has after the bind: same index, the key byte the
    /// consumer chose (`ibv_inc_rkey`).
    pub new_rkey: u32,
    /// The memory region, by its lkey (0 with length 0: unbind, type 1).
    pub mr_lkey: u32,
    /// First address of the window, in the region's iova space.
    pub addr: u64,
    /// Length in bytes (0: unbind, type 1 only).
    pub length: u64,
    /// Remote rights the window grants (`REMOTE_READ`, `REMOTE_WRITE`,
    /// `REMOTE_ATOMIC`).
    pub access: AccessFlags,
}

/// Why a bind, an invalidation or a window verb was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// No such window or region, or a stale key.
    #[error("no memory window or region with that key")]
    BadKey,
    /// Window, region and QP are not all of one protection domain.
    #[error("protection domains differ")]
    WrongPd,
    /// The region lacks `MW_BIND`, or the rights asked need `LOCAL_WRITE`
    /// on it, or rights other than remote ones were asked.
    #[error("access rights do not allow the bind")]
    Access,
    /// The window would reach outside the region.
    #[error("window outside its region")]
    OutOfRange,
    /// The new key names another window (index changed).
    #[error("the new key's index is not the window's")]
    KeyIndex,
    /// A type 2 window already bound (it must be invalidated first), or a
    /// type 1 window named where only type 2 may be (invalidation), or
    /// the reverse.
    #[error("wrong window type or state for this operation")]
    State,
    /// The window is bound to another QP.
    #[error("window bound to another QP")]
    WrongQp,
    /// Zero-based windows are not supported.
    #[error("zero-based windows are not supported")]
    ZeroBased,
}

/// A window's current binding.
#[derive(Debug, Clone, Copy)]
struct Binding {
    /// The region it is bound into (its key at bind time).
    mr_key: u32,
    addr: u64,
    length: u64,
    access: AccessFlags,
    /// Type 2: the QP it was bound through.
    qpn: Option<u32>,
}

/// A memory window.
#[derive(Debug)]
struct Window {
    rkey: u32,
    pd: PdId,
    kind: MwType,
    binding: Option<Binding>,
}

/// A scatter/gather element of a local work request (`ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Start address, in the iova space of the region `lkey` names.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// An atomic operation on a region's 8-byte word.
#[derive(Debug, Clone, Copy)]
enum AtomicOp {
    CmpSwap {
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        add: u64,
    },
    /// ATOMIC WRITE: store the value (native byte order: the payload's
    /// bytes as they were).
    Store {
        value: u64,
    },
}

/// The bytes of one region: a raw pointer and a length, and whether the
/// table owns the allocation.
#[derive(Debug)]
struct Mem {
    /// Start of the memory; never null.
    ptr: NonNull<u8>,
    /// Length in bytes; `ptr..ptr + len` does not wrap and `len <= isize::MAX`.
    len: usize,
    /// `Some(words)` when `ptr` came from `Box::into_raw` of a
    /// `Box<[u64]>` of `words` words that this `Mem` owns.
    owned_words: Option<usize>,
    /// On-demand paging: the region starts at this address of the process
    /// and `ptr` is not used. Its pages may be unmapped or remapped at any
    /// time, so they are only reached through `process_vm_readv`/`writev`,
    /// which report such a page instead of faulting.
    odp_base: Option<usize>,
}

/// Bytes of registered memory a packet's payload is sent from without a
/// copy into the transmit buffer ([`MemoryTable::gather_ref`],
/// [`MemoryTable::remote_read_ref`]): the socket reads them straight from
/// the region. Only an address and a length: the region may go away once
/// the table is changed, so whoever holds one must send it (or drop it)
/// before the next change to the table, which the device guarantees by
/// sending under the lock the engine lives behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadRef {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `PayloadRef` is an address and a length; nothing is read
// through it except by `PayloadRef::bytes`, whose caller promises the
// region is still registered (and `Mem` itself is `Send`).
unsafe impl Send for PayloadRef {}

impl PayloadRef {
    /// The first byte's address (for an iovec: the kernel reads it).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never, as made by the table).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    ///
    /// # Safety
    /// The region they were taken from must still be registered, and the
    /// table unchanged since they were taken (no deregistration, no
    /// table method taking `&mut self` in between); the slice must be
    /// dropped before that changes.
    pub unsafe fn bytes<'a>(&self) -> &'a [u8] {
        // SAFETY: `ptr..ptr + len` lay inside a registered region when the
        // table made this (checked by `Mem::borrow`), and the caller
        // promises that region is still registered: owned memory is then
        // still our allocation, raw memory valid by `register_raw`'s
        // contract. The table writes memory only from `&mut self` methods,
        // which the caller promises do not run while the slice lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

/// Copy `out.len()` bytes at address `addr` of this process into `out`
/// with `process_vm_readv`: an unmapped page is an error, never a fault.
fn vm_read(addr: usize, out: &mut [u8]) -> Result<(), AccessError> {
    if out.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: out.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: out.len(),
    };
    // SAFETY: `local` describes `out`, valid for `out.len()` bytes of
    // writes; the kernel reads `remote` with this process's page tables and
    // permissions and reports an unmapped or unreadable page as an error
    // (no Rust reference to that memory exists).
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if usize::try_from(n) == Ok(out.len()) {
        Ok(())
    } else {
        Err(AccessError::Unmapped)
    }
}

/// Copy `data` to address `addr` of this process with
/// `process_vm_writev`: an unmapped or read-only page is an error.
fn vm_write(addr: usize, data: &[u8]) -> Result<(), AccessError> {
    if data.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: `local` describes `data`, only read; the kernel writes
    // `remote` with this process's page tables and permissions and reports
    // an unmapped or read-only page as an error. The registrant of an
    // on-demand region allowed remote writes to it (like any registration).
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    if usize::try_from(n) == Ok(data.len()) {
        Ok(())
    } else {
        Err(AccessError::Unmapped)
    }
}

// SAFETY: an owned `Mem` uniquely owns its allocation, like the
// `Box<[u64]>` it came from (which is `Send`). A raw `Mem` points at memory
// whose registrant promised (`MemoryTable::register_raw`'s contract) that
// it stays valid until deregistration and may be read and written by the
// table from whatever thread owns the table. `Mem` is not `Sync`, so two
// threads never use one `Mem` at once.
unsafe impl Send for Mem {}

impl Mem {
    /// A zeroed, 8-byte aligned buffer of `len` bytes, or `None` when it
    /// cannot be allocated.
    fn owned(len: usize) -> Option<Mem> {
        if isize::try_from(len).is_err() {
            return None;
        }
        let words = len.div_ceil(8);
        let mut buf: Vec<u64> = Vec::new();
        buf.try_reserve_exact(words).ok()?;
        buf.resize(words, 0);
        let raw: *mut [u64] = Box::into_raw(buf.into_boxed_slice());
        Some(Mem {
            ptr: NonNull::new(raw.cast::<u8>())?,
            len,
            owned_words: Some(words),
            odp_base: None,
        })
    }

    /// Checks that `[off, off + len)` lies inside the memory.
    fn check(&self, off: usize, len: usize) -> Result<(), AccessError> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(AccessError::OutOfRange),
        }
    }

    /// Bytes `[off, off + len)` by reference, for sending without a copy;
    /// `None` for on-demand memory (reached only through
    /// `process_vm_readv`, whose pages may go at any time) or nothing.
    fn borrow(&self, off: usize, len: usize) -> Result<Option<PayloadRef>, AccessError> {
        self.check(off, len)?;
        if self.odp_base.is_some() || len == 0 {
            return Ok(None);
        }
        // `off + len <= self.len` (checked): the address stays inside the
        // memory, so it is not null and does not wrap.
        let ptr =
            NonNull::new(self.ptr.as_ptr().wrapping_add(off)).ok_or(AccessError::OutOfRange)?;
        Ok(Some(PayloadRef { ptr, len }))
    }

    /// Copies bytes `[off, off + out.len())` of the memory into `out`.
    fn read(&self, off: usize, out: &mut [u8]) -> Result<(), AccessError> {
        self.check(off, out.len())?;
        if let Some(base) = self.odp_base {
            return vm_read(base.wrapping_add(off), out);
        }
        // SAFETY: `off + out.len() <= self.len` (checked just above), and
        // `ptr..ptr + len` is valid for reads: owned memory is our live
        // allocation, raw memory is valid until deregistration by
        // `register_raw`'s contract. `out` does not overlap it: no reference
        // to owned memory ever leaves the table, and that contract forbids
        // slices overlapping raw memory.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len());
        }
        Ok(())
    }

    /// Copies `data` into bytes `[off, off + data.len())` of the memory.
    ///
    /// Takes `&self` because the bytes live behind a raw pointer, not in
    /// `self`; the table only calls it from `&mut self` methods.
    fn write(&self, off: usize, data: &[u8]) -> Result<(), AccessError> {
        self.check(off, data.len())?;
        if let Some(base) = self.odp_base {
            return vm_write(base.wrapping_add(off), data);
        }
        // SAFETY: `off + data.len() <= self.len` (checked just above), and
        // `ptr..ptr + len` is valid for writes: owned memory is our live
        // allocation (reached only through this table, which is not
        // `Sync`), raw memory is valid for writes until deregistration by
        // `register_raw`'s contract, which also forbids `data` to overlap
        // it (and no reference to owned memory ever leaves the table).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len());
        }
        Ok(())
    }

    /// Performs `op` on the native-endian word at `off`; returns the
    /// original value.
    fn atomic(&self, off: usize, op: AtomicOp) -> Result<u64, AccessError> {
        self.check(off, 8)?;
        if let Some(base) = self.odp_base {
            // Atomic among the device's own atomics (IBV_ATOMIC_HCA): every
            // remote atomic runs on the engine's one thread.
            let addr = base.wrapping_add(off);
            if addr % 8 != 0 {
                return Err(AccessError::Misaligned);
            }
            let mut b = [0u8; 8];
            vm_read(addr, &mut b)?;
            let old = u64::from_ne_bytes(b);
            let new = match op {
                AtomicOp::CmpSwap { compare, swap } if old == compare => swap,
                AtomicOp::CmpSwap { .. } => old,
                AtomicOp::FetchAdd { add } => old.wrapping_add(add),
                AtomicOp::Store { value } => value,
            };
            vm_write(addr, &new.to_ne_bytes())?;
            return Ok(old);
        }
        let target = self.ptr.as_ptr().wrapping_add(off).cast::<u64>();
        if !target.is_aligned() {
            return Err(AccessError::Misaligned);
        }
        // SAFETY: `off + 8 <= self.len` (checked above), so the 8 bytes at
        // `target` are inside the region, which is valid for reads and
        // writes (our allocation, or raw memory by `register_raw`'s
        // contract) for as long as this call lasts; `target` is aligned for
        // `u64`/`AtomicU64` (checked above). The table never accesses the
        // word non-atomically at the same time (it is single-threaded and
        // not `Sync`); the registrant of raw memory synchronises its own
        // accesses with the engine's, per the contract.
        let word = unsafe { AtomicU64::from_ptr(target) };
        Ok(match op {
            AtomicOp::CmpSwap { compare, swap } => {
                match word.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(old) | Err(old) => old,
                }
            }
            AtomicOp::FetchAdd { add } => word.fetch_add(add, Ordering::SeqCst),
            AtomicOp::Store { value } => word.swap(value, Ordering::SeqCst),
        })
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        if let Some(words) = self.owned_words {
            let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr().cast::<u64>(), words);
            // SAFETY: `raw` is exactly the pointer `Box::into_raw` returned
            // in `Mem::owned` for a `Box<[u64]>` of `words` words; this
            // `Mem` owned it ever since, and this is the only place that
            // frees it.
            drop(unsafe { Box::from_raw(raw) });
        }
    }
}

/// One live region.
#[derive(Debug)]
struct Region {
    info: MrInfo,
    mem: Mem,
    /// Memory windows bound into it: it cannot be deregistered until they
    /// are unbound, invalidated or deallocated.
    windows: u32,
    /// A region over device memory: the handle of the buffer it lies in.
    dm: Option<u32>,
}

/// Device memory (`ibv_alloc_dm`) a soft device can give: per buffer and
/// in all, per device.
pub const MAX_DM_SIZE: usize = 256 * 1024;

/// A device memory buffer: zeroed, aligned as asked, owned by the table.
#[derive(Debug)]
struct DmBuf {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
    len: usize,
    /// Regions registered over it: it cannot be freed before them.
    regions: u32,
}

// SAFETY: a `DmBuf` uniquely owns its allocation (like a `Box`), reached
// only through the table, which is `Send` and not `Sync`.
unsafe impl Send for DmBuf {}

impl Drop for DmBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed(self.layout)` and is freed
        // once; no region points into it any more (`free_dm` refuses
        // while `regions > 0`, and a table dropped whole drops its regions,
        // which do not free DM memory).
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

impl Region {
    /// Checks `pd`, `need` and `[va, va + len)`; returns the byte offset of
    /// `va` in the region.
    fn check(&self, pd: PdId, need: AccessFlags, va: u64, len: u64) -> Result<usize, AccessError> {
        if self.info.pd != pd {
            return Err(AccessError::WrongPd);
        }
        if !self.info.access.contains(need) {
            return Err(AccessError::NoPermission);
        }
        let off = va
            .checked_sub(self.info.addr)
            .ok_or(AccessError::OutOfRange)?;
        match off.checked_add(len) {
            Some(end) if end <= self.info.length => {
                usize::try_from(off).map_err(|_| AccessError::OutOfRange)
            }
            _ => Err(AccessError::OutOfRange),
        }
    }
}

/// The memory regions of one engine, and every access to their bytes.
#[derive(Debug)]
pub struct MemoryTable {
    /// Live regions by key index (`key >> 8`).
    regions: FxHashMap<u32, Region>,
    /// Live memory windows by key index (the same index space).
    windows: FxHashMap<u32, Window>,
    /// Device memory buffers by handle.
    dms: FxHashMap<u32, DmBuf>,
    next_dm: u32,
    /// Key byte last used by each index (`key_bytes[index - 1]`).
    key_bytes: Vec<u8>,
    /// State of the generator of key bytes (SplitMix64, seeded from the
    /// process's hash randomness and the clock).
    key_rng: u64,
    /// Next index to try (cyclic in `1..=max_regions`).
    next_index: u32,
    /// Limit on live regions, and highest index.
    max_regions: u32,
}

impl Default for MemoryTable {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryTable {
    /// An empty table allowing [`MAX_REGIONS`] live regions.
    pub fn new() -> Self {
        Self::with_max_regions(MAX_REGIONS)
    }

    /// An empty table allowing `max` live regions (clamped to
    /// `1..=2^24 - 1`, the indices a key can hold).
    pub fn with_max_regions(max: u32) -> Self {
        MemoryTable {
            regions: FxHashMap::default(),
            windows: FxHashMap::default(),
            dms: FxHashMap::default(),
            next_dm: 1,
            key_bytes: Vec::new(),
            key_rng: {
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u128(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos()),
                );
                h.finish()
            },
            next_index: 1,
            max_regions: max.clamp(1, MAX_KEY_INDEX),
        }
    }

    /// Number of live regions.
    pub fn region_count(&self) -> usize {
        self.regions.len()
    }

    /// Register memory the table owns: a zeroed, 8-byte aligned buffer of
    /// `len` bytes whose iova is the buffer's address (like `ibv_reg_mr`),
    /// or 0 with [`AccessFlags::ZERO_BASED`].
    ///
    /// Errors (`ibv_reg_mr`): `EINVAL` for unknown access bits, or
    /// `REMOTE_WRITE` / `REMOTE_ATOMIC` without `LOCAL_WRITE` (the
    /// libibverbs/rxe rule); `EOPNOTSUPP` for `ON_DEMAND`; `ENOMEM` when the
    /// table is full or the buffer cannot be allocated.
    pub fn register_owned(
        &mut self,
        pd: PdId,
        len: usize,
        access: AccessFlags,
    ) -> Result<MrInfo, VerbsError> {
        let access = check_access(access)?;
        self.check_room()?;
        let mem = Mem::owned(len).ok_or_else(|| {
            VerbsError::new(
                VERB_REG,
                Errno::ENOMEM,
                format!("cannot allocate {len} bytes"),
            )
        })?;
        let iova = if access.contains(AccessFlags::ZERO_BASED) {
            0
        } else {
            addr_u64(mem.ptr.as_ptr() as usize)?
        };
        self.insert(pd, mem, iova, access)
    }

    /// Register caller memory `ptr..ptr + len`, which work requests and
    /// peers address as `iova..iova + len`. With
    /// [`AccessFlags::ZERO_BASED`], `iova` must be 0.
    ///
    /// Errors (`ibv_reg_mr`): those of [`register_owned`](Self::register_owned),
    /// and `EINVAL` for a null `ptr`, `len > isize::MAX`, `ptr + len`
    /// wrapping the address space, `iova + len` overflowing `u64`, or
    /// `ZERO_BASED` with a non-zero `iova`.
    ///
    /// # Safety
    ///
    /// From this call until [`deregister`](Self::deregister) returns for
    /// this region (or the table is dropped):
    ///
    /// - `ptr..ptr + len` must be valid for reads and writes, and must not
    ///   be freed or unmapped;
    /// - the table may read and write it at any time, from whichever thread
    ///   owns the table: remote peers holding the rkey write it whenever
    ///   they like, as with real RDMA;
    /// - the caller must not hold Rust references to any part of it while
    ///   the engine may access it, nor pass slices overlapping it to this
    ///   table's methods, and must synchronise its own accesses with the
    ///   engine's (e.g. read only after the completion), since unsynchronised
    ///   concurrent accesses would be data races.
    pub unsafe fn register_raw(
        &mut self,
        pd: PdId,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MrInfo, VerbsError> {
        let access = check_access(access)?;
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| VerbsError::new(VERB_REG, Errno::EINVAL, "null address"))?;
        if isize::try_from(len).is_err() || (ptr.as_ptr() as usize).checked_add(len).is_none() {
            return Err(VerbsError::new(
                VERB_REG,
                Errno::EINVAL,
                "address range wraps",
            ));
        }
        let len64 = addr_u64(len)?;
        if iova.checked_add(len64).is_none() {
            return Err(VerbsError::new(
                VERB_REG,
                Errno::EINVAL,
                "iova + length overflows",
            ));
        }
        if access.contains(AccessFlags::ZERO_BASED) && iova != 0 {
            return Err(VerbsError::new(
                VERB_REG,
                Errno::EINVAL,
                "ZERO_BASED needs iova 0",
            ));
        }
        self.check_room()?;
        let mem = Mem {
            ptr,
            len,
            owned_words: None,
            odp_base: None,
        };
        self.insert(pd, mem, iova, access)
    }

    /// Register `addr..addr + len` of this process with on-demand paging
    /// (`IBV_ACCESS_ON_DEMAND`), named `iova` on the wire. Nothing about
    /// the memory is promised: its pages may be unmapped, remapped or not
    /// yet touched, and every access goes through `process_vm_readv` /
    /// `writev`, so a page that is not there is a remote access error (a
    /// local protection error for local work requests), never a fault.
    /// `addr` 0 and `len` `usize::MAX` is an implicit ODP region: the whole
    /// address space. Atomics are atomic among the device's own
    /// (`IBV_ATOMIC_HCA`).
    ///
    /// Errors: as [`register_raw`](Self::register_raw); `EOPNOTSUPP` where
    /// the kernel refuses `process_vm_readv` on this process (a seccomp
    /// profile).
    pub fn register_odp(
        &mut self,
        pd: PdId,
        addr: usize,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MrInfo, VerbsError> {
        let access = check_access(AccessFlags(access.0 & !AccessFlags::ON_DEMAND.0))?;
        if addr.checked_add(len).is_none() || iova.checked_add(addr_u64(len)?).is_none() {
            return Err(VerbsError::new(
                VERB_REG,
                Errno::EINVAL,
                "address range wraps",
            ));
        }
        if access.contains(AccessFlags::ZERO_BASED) && iova != 0 {
            return Err(VerbsError::new(
                VERB_REG,
                Errno::EINVAL,
                "ZERO_BASED needs iova 0",
            ));
        }
        let probe = 0u8;
        let mut got = [0u8; 1];
        if vm_read(std::ptr::addr_of!(probe) as usize, &mut got).is_err() {
            return Err(VerbsError::new(
                VERB_REG,
                Errno::EOPNOTSUPP,
                "on-demand paging needs process_vm_readv on this process, which the kernel refuses",
            ));
        }
        self.check_room()?;
        let mem = Mem {
            ptr: NonNull::dangling(),
            len,
            owned_words: None,
            odp_base: Some(addr),
        };
        let access = AccessFlags(access.0 | AccessFlags::ON_DEMAND.0);
        self.insert(pd, mem, iova, access)
    }

    /// Deregister the region `lkey` names (`ibv_dereg_mr`); owned memory is
    /// freed. `EINVAL` for an unknown (or stale, or 0) key.
    ///
    /// Afterwards no access through its keys succeeds. Every access and
    /// deregistration is serialised through this table (writes and
    /// deregistration take `&mut self`), so no access can be in flight
    /// while this runs; when this returns, raw memory is no longer touched.
    pub fn deregister(&mut self, lkey: u32) -> Result<(), VerbsError> {
        let index = lkey >> 8;
        match self.regions.get(&index) {
            Some(region) if region.info.lkey == lkey && region.windows > 0 => Err(VerbsError::new(
                VERB_DEREG,
                Errno::EBUSY,
                format!("{} memory windows are bound to it", region.windows),
            )),
            Some(region) if region.info.lkey == lkey => {
                if let Some(r) = self.regions.remove(&index) {
                    if let Some(d) = r.dm.and_then(|h| self.dms.get_mut(&h)) {
                        d.regions = d.regions.saturating_sub(1);
                    }
                }
                Ok(())
            }
            _ => Err(VerbsError::new(
                VERB_DEREG,
                Errno::EINVAL,
                format!("no memory region with lkey {lkey:#x}"),
            )),
        }
    }

    /// `ibv_alloc_dm`: `len` zeroed bytes of device memory aligned to
    /// `2^log_align` (at most 4096). Returns its handle. `EINVAL` for a
    /// zero length, a length over [`MAX_DM_SIZE`] or an alignment over
    /// 4096; `ENOMEM` when the device's device memory is used up.
    pub fn alloc_dm(&mut self, len: usize, log_align: u32) -> Result<u32, VerbsError> {
        const VERB: &str = "ibv_alloc_dm";
        if len == 0 || len > MAX_DM_SIZE || log_align > 12 {
            return Err(VerbsError::new(
                VERB,
                Errno::EINVAL,
                format!("{len} bytes aligned to 2^{log_align} (at most {MAX_DM_SIZE}, 2^12)"),
            ));
        }
        let used: usize = self.dms.values().map(|d| d.len).sum();
        if used + len > MAX_DM_SIZE {
            return Err(VerbsError::new(
                VERB,
                Errno::ENOMEM,
                format!("{used} of {MAX_DM_SIZE} bytes of device memory in use"),
            ));
        }
        let layout = std::alloc::Layout::from_size_align(len, (1usize << log_align).max(8))
            .map_err(|e| VerbsError::new(VERB, Errno::EINVAL, e.to_string()))?;
        // SAFETY: `layout` has a non-zero size (len > 0).
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| VerbsError::new(VERB, Errno::ENOMEM, "allocation failed"))?;
        let handle = self.next_dm;
        self.next_dm = self.next_dm.wrapping_add(1).max(1);
        self.dms.insert(
            handle,
            DmBuf {
                ptr,
                layout,
                len,
                regions: 0,
            },
        );
        Ok(handle)
    }

    /// `ibv_free_dm`: `EBUSY` while regions are registered over it,
    /// `EINVAL` for no such buffer.
    pub fn free_dm(&mut self, handle: u32) -> Result<(), VerbsError> {
        match self.dms.get(&handle) {
            None => Err(VerbsError::new(
                "ibv_free_dm",
                Errno::EINVAL,
                "no such device memory",
            )),
            Some(d) if d.regions > 0 => Err(VerbsError::new(
                "ibv_free_dm",
                Errno::EBUSY,
                format!("{} memory regions registered over it", d.regions),
            )),
            Some(_) => {
                self.dms.remove(&handle);
                Ok(())
            }
        }
    }

    /// The checked byte range `[offset, offset + len)` of device memory
    /// `handle`: offset and length must be multiples of 4 (as mlx5's).
    fn dm_range(
        &self,
        verb: &'static str,
        handle: u32,
        offset: u64,
        len: usize,
    ) -> Result<*mut u8, VerbsError> {
        let d = self
            .dms
            .get(&handle)
            .ok_or_else(|| VerbsError::new(verb, Errno::EINVAL, "no such device memory"))?;
        let off = usize::try_from(offset)
            .ok()
            .filter(|o| o.is_multiple_of(4) && len.is_multiple_of(4));
        match off.and_then(|o| o.checked_add(len).map(|end| (o, end))) {
            Some((o, end)) if end <= d.len => Ok(d.ptr.as_ptr().wrapping_add(o)),
            _ => Err(VerbsError::new(
                verb,
                Errno::EINVAL,
                format!(
                    "{len} bytes at {offset}: not 4-byte aligned or past the {} bytes",
                    d.len
                ),
            )),
        }
    }

    /// `ibv_memcpy_to_dm`.
    pub fn dm_write(&mut self, handle: u32, offset: u64, data: &[u8]) -> Result<(), VerbsError> {
        let p = self.dm_range("ibv_memcpy_to_dm", handle, offset, data.len())?;
        // SAFETY: `p..p + data.len()` lies in the live buffer (checked by
        // dm_range); the table is not `Sync` and this takes `&mut self`, so
        // nothing else touches it now; `data` is the caller's, not DM.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    /// `ibv_memcpy_from_dm`.
    pub fn dm_read(&self, handle: u32, offset: u64, out: &mut [u8]) -> Result<(), VerbsError> {
        let p = self.dm_range("ibv_memcpy_from_dm", handle, offset, out.len())?;
        // SAFETY: as dm_write; reads only, and no writer runs at the same
        // time (writes take `&mut self`).
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// `ibv_reg_dm_mr`: bytes `[offset, offset + len)` of device memory
    /// `handle` as a zero-based region (`ZERO_BASED` is required, as
    /// libibverbs requires it). `EINVAL` beyond the buffer.
    pub fn register_dm(
        &mut self,
        pd: PdId,
        handle: u32,
        offset: u64,
        len: usize,
        access: AccessFlags,
    ) -> Result<MrInfo, VerbsError> {
        const VERB: &str = "ibv_reg_dm_mr";
        let access = check_access(access)?;
        if !access.contains(AccessFlags::ZERO_BASED) {
            return Err(VerbsError::new(
                VERB,
                Errno::EINVAL,
                "device memory regions are zero-based",
            ));
        }
        let d = self
            .dms
            .get(&handle)
            .ok_or_else(|| VerbsError::new(VERB, Errno::EINVAL, "no such device memory"))?;
        let start = usize::try_from(offset)
            .ok()
            .filter(|o| o.checked_add(len).is_some_and(|end| end <= d.len))
            .ok_or_else(|| {
                VerbsError::new(
                    VERB,
                    Errno::EINVAL,
                    format!("{len} bytes at {offset}: past the {} bytes", d.len),
                )
            })?;
        self.check_room()?;
        let mem = Mem {
            // In the buffer (checked above); dangling only for an empty
            // region at the end, which is never dereferenced.
            ptr: NonNull::new(d.ptr.as_ptr().wrapping_add(start)).unwrap_or(NonNull::dangling()),
            len,
            owned_words: None,
            odp_base: None,
        };
        let info = self.insert(pd, mem, 0, access)?;
        if let Some(r) = self.regions.get_mut(&(info.lkey >> 8)) {
            r.dm = Some(handle);
        }
        if let Some(d) = self.dms.get_mut(&handle) {
            d.regions += 1;
        }
        Ok(info)
    }

    /// How many memory windows are bound into the region `lkey` names (0
    /// for no such region).
    pub fn bound_windows(&self, lkey: u32) -> u32 {
        self.lookup(lkey).map_or(0, |r| r.windows)
    }

    /// Deregister the region `lkey` names even with windows bound into it:
    /// they are unbound first (their keys stop working), so no remote
    /// access reaches the memory afterwards. For an owner that cannot
    /// report failure (a `Drop`); the verb is [`deregister`](Self::deregister).
    pub fn deregister_unbinding(&mut self, lkey: u32) -> Result<(), VerbsError> {
        if self.bound_windows(lkey) > 0 {
            for w in self.windows.values_mut() {
                if w.binding.is_some_and(|b| b.mr_key == lkey) {
                    w.binding = None;
                }
            }
            if let Some(r) = self.regions.get_mut(&(lkey >> 8)) {
                r.windows = 0;
            }
        }
        self.deregister(lkey)
    }

    /// `ibv_rereg_mr`: move the region `lkey` names to another PD, give it
    /// other access rights, and/or (unsafe, see
    /// [`reregister_translation`](Self::reregister_translation)) other
    /// memory, keeping its keys (as rxe does). Checked like a registration
    /// (`EINVAL` for bad access bits, `EINVAL` for an unknown key);
    /// nothing changes when a check fails. Every access is serialised
    /// through this table, so none sees a half-changed region.
    pub fn reregister(
        &mut self,
        lkey: u32,
        pd: Option<PdId>,
        access: Option<AccessFlags>,
    ) -> Result<MrInfo, VerbsError> {
        let access = access.map(check_access).transpose()?;
        let region = self.region_mut(lkey)?;
        if let Some(a) = access {
            if a.contains(AccessFlags::ZERO_BASED)
                != region.info.access.contains(AccessFlags::ZERO_BASED)
            {
                return Err(VerbsError::new(
                    VERB_REREG,
                    Errno::EINVAL,
                    "ZERO_BASED changes the translation",
                ));
            }
            region.info.access = a;
        }
        if let Some(pd) = pd {
            region.info.pd = pd;
        }
        Ok(region.info)
    }

    /// `ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_TRANSLATION`: the region
    /// `lkey` names now covers caller memory `ptr..ptr + len`, addressed as
    /// `iova` (with the region's or the new `access`, and PD), keeping its
    /// keys. An owned region's buffer is freed.
    ///
    /// # Safety
    /// As [`register_raw`](Self::register_raw), for the new memory.
    pub unsafe fn reregister_translation(
        &mut self,
        lkey: u32,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        pd: Option<PdId>,
        access: Option<AccessFlags>,
    ) -> Result<MrInfo, VerbsError> {
        let old = self.region_mut(lkey)?.info;
        let access = access.map_or(Ok(old.access), check_access)?;
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| VerbsError::new(VERB_REREG, Errno::EINVAL, "null address"))?;
        let len64 = addr_u64(len)?;
        if isize::try_from(len).is_err()
            || (ptr.as_ptr() as usize).checked_add(len).is_none()
            || iova.checked_add(len64).is_none()
            || (access.contains(AccessFlags::ZERO_BASED) && iova != 0)
        {
            return Err(VerbsError::new(
                VERB_REREG,
                Errno::EINVAL,
                "address range wraps or does not fit the access",
            ));
        }
        let region = self.region_mut(lkey)?;
        // An on-demand region stays one, at the new address.
        let odp = old.access.contains(AccessFlags::ON_DEMAND);
        region.mem = Mem {
            ptr,
            len,
            owned_words: None,
            odp_base: odp.then_some(ptr.as_ptr() as usize),
        };
        region.info.addr = iova;
        region.info.length = len64;
        region.info.access = access;
        if let Some(pd) = pd {
            region.info.pd = pd;
        }
        Ok(region.info)
    }

    fn region_mut(&mut self, lkey: u32) -> Result<&mut Region, VerbsError> {
        match self.regions.get_mut(&(lkey >> 8)) {
            Some(r) if r.info.lkey == lkey => Ok(r),
            _ => Err(VerbsError::new(
                VERB_REREG,
                Errno::EINVAL,
                format!("no memory region with lkey {lkey:#x}"),
            )),
        }
    }

    /// The region `lkey` names, if live.
    pub fn query(&self, lkey: u32) -> Option<MrInfo> {
        self.lookup(lkey).ok().map(|region| region.info)
    }

    /// Copy bytes `[offset, offset + out.len())` of an owned region into
    /// `out`, without access checks (the application reading its own
    /// buffer). `BadKey` if `lkey` does not name a live owned region,
    /// `OutOfRange` if the range is not inside it.
    pub fn owned_read(&self, lkey: u32, offset: usize, out: &mut [u8]) -> Result<(), AccessError> {
        self.lookup_owned(lkey)?.mem.read(offset, out)
    }

    /// Copy `data` into bytes `[offset, offset + data.len())` of an owned
    /// region, without access checks (the application writing its own
    /// buffer). Errors as [`owned_read`](Self::owned_read).
    pub fn owned_write(
        &mut self,
        lkey: u32,
        offset: usize,
        data: &[u8],
    ) -> Result<(), AccessError> {
        self.lookup_owned(lkey)?.mem.write(offset, data)
    }

    /// An incoming RDMA WRITE's payload: write `data` at `[va, va +
    /// data.len())` of the region `rkey` names, for a QP of protection
    /// domain `pd`. Needs `REMOTE_WRITE`. Even an empty `data` needs a
    /// valid key and `va` inside the region (or at its end).
    pub fn remote_write(
        &mut self,
        rkey: u32,
        by: impl Into<RemoteQp>,
        va: u64,
        data: &[u8],
    ) -> Result<(), AccessError> {
        let (region, off) = self.resolve_remote(
            rkey,
            by.into(),
            AccessFlags::REMOTE_WRITE,
            va,
            slice_len(data)?,
        )?;
        region.mem.write(off, data)
    }

    /// An incoming RDMA READ: read `[va, va + out.len())` of the region
    /// `rkey` names into `out`, for a QP of protection domain `pd`. Needs
    /// `REMOTE_READ`. Even an empty `out` needs a valid key and `va` inside
    /// the region (or at its end).
    pub fn remote_read(
        &self,
        rkey: u32,
        by: impl Into<RemoteQp>,
        va: u64,
        out: &mut [u8],
    ) -> Result<(), AccessError> {
        let (region, off) = self.resolve_remote(
            rkey,
            by.into(),
            AccessFlags::REMOTE_READ,
            va,
            slice_len(out)?,
        )?;
        region.mem.read(off, out)
    }

    /// [`remote_read`](Self::remote_read) by reference: the same checks,
    /// then the memory itself (`None` where it must be copied: on-demand
    /// memory, or nothing).
    pub fn remote_read_ref(
        &self,
        rkey: u32,
        by: impl Into<RemoteQp>,
        va: u64,
        len: usize,
    ) -> Result<Option<PayloadRef>, AccessError> {
        let wide = u64::try_from(len).map_err(|_| AccessError::OutOfRange)?;
        let (region, off) =
            self.resolve_remote(rkey, by.into(), AccessFlags::REMOTE_READ, va, wide)?;
        region.mem.borrow(off, len)
    }

    /// Check a whole remote range `[va, va + len)` once, for access `need`
    /// (used when a multi-packet WRITE/READ starts: rxe checks the RETH
    /// range at FIRST/ONLY).
    ///
    /// A zero-length range succeeds without any key lookup: a zero-length
    /// RDMA operation needs no valid rkey (IBA C9-88), so its key, PD and
    /// address are not examined.
    pub fn check_remote(
        &self,
        rkey: u32,
        by: impl Into<RemoteQp>,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(), AccessError> {
        if len == 0 {
            return Ok(());
        }
        self.resolve_remote(rkey, by.into(), need, va, len)
            .map(|_| ())
    }

    /// An incoming ATOMIC CMP_SWAP on the 8 bytes at `va`: if they equal
    /// `compare`, replace them with `swap`. Returns the original value.
    ///
    /// Needs `REMOTE_ATOMIC`, `[va, va + 8)` inside the region (checked
    /// first, as rxe does) and `va` 8-byte aligned. The word is a
    /// native-endian `u64` in host memory, as a NIC's atomic operates on
    /// host memory; the engine converts to and from the wire's big-endian.
    pub fn atomic_cmp_swap(
        &mut self,
        rkey: u32,
        by: impl Into<RemoteQp>,
        va: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, AccessError> {
        self.atomic(rkey, by.into(), va, AtomicOp::CmpSwap { compare, swap })
    }

    /// An incoming ATOMIC FETCH_ADD on the 8 bytes at `va` (wrapping).
    /// Returns the original value. Checks and byte order as
    /// [`atomic_cmp_swap`](Self::atomic_cmp_swap).
    pub fn atomic_fetch_add(
        &mut self,
        rkey: u32,
        by: impl Into<RemoteQp>,
        va: u64,
        add: u64,
    ) -> Result<u64, AccessError> {
        self.atomic(rkey, by.into(), va, AtomicOp::FetchAdd { add })
    }

    /// Read bytes `[offset, offset + out.len())` of the concatenation of
    /// the SGEs' memory into `out` (requester gather), for a QP of
    /// protection domain `pd`. Reads need nothing beyond a valid lkey in
    /// `pd`.
    ///
    /// Only the SGEs (and the parts of them) the range touches are checked,
    /// as rxe does; zero-length SGEs are skipped unexamined, and an empty
    /// range examines none. `OutOfRange` when the range runs past the SGE
    /// list's total length. On error, `out` may be partly filled.
    pub fn gather(
        &self,
        pd: PdId,
        sges: &[Sge],
        offset: usize,
        out: &mut [u8],
    ) -> Result<(), AccessError> {
        self.walk_sges(
            pd,
            sges,
            offset,
            out.len(),
            AccessFlags::NONE,
            |region, off, range| match out.get_mut(range) {
                Some(piece) => region.mem.read(off, piece),
                None => Err(AccessError::OutOfRange),
            },
        )
    }

    /// [`gather`](Self::gather) by reference: when bytes `[offset,
    /// offset + len)` of the SGEs' memory lie in one region that can be
    /// sent from directly, that memory (`Some`); `None` when they must be
    /// gathered (several pieces, on-demand memory, nothing). The same
    /// checks as `gather`, with the same errors.
    pub fn gather_ref(
        &self,
        pd: PdId,
        sges: &[Sge],
        offset: usize,
        len: usize,
    ) -> Result<Option<PayloadRef>, AccessError> {
        let mut found: Option<Option<PayloadRef>> = None;
        self.walk_sges(
            pd,
            sges,
            offset,
            len,
            AccessFlags::NONE,
            |region, off, range| {
                // A second piece: gathered after all (still checked).
                found = match found {
                    None => Some(region.mem.borrow(off, range.len())?),
                    Some(_) => Some(None),
                };
                Ok(())
            },
        )?;
        Ok(found.flatten())
    }

    /// Write `data` to bytes `[offset, offset + data.len())` of the
    /// concatenation of the SGEs' memory (receive scatter, READ-response
    /// and atomic-result placement). Every touched region needs
    /// `LOCAL_WRITE`.
    ///
    /// Checks as [`gather`](Self::gather); all of them are made before the
    /// first byte is written, so a refused scatter writes nothing.
    pub fn scatter(
        &mut self,
        pd: PdId,
        sges: &[Sge],
        offset: usize,
        data: &[u8],
    ) -> Result<(), AccessError> {
        let need = AccessFlags::LOCAL_WRITE;
        self.walk_sges(pd, sges, offset, data.len(), need, |_, _, _| Ok(()))?;
        self.walk_sges(
            pd,
            sges,
            offset,
            data.len(),
            need,
            |region, off, range| match data.get(range) {
                Some(piece) => region.mem.write(off, piece),
                None => Err(AccessError::OutOfRange),
            },
        )
    }

    /// Total length of an SGE list (saturating; it cannot overflow in
    /// practice).
    pub fn sge_total(sges: &[Sge]) -> u64 {
        sges.iter()
            .fold(0u64, |sum, sge| sum.saturating_add(u64::from(sge.length)))
    }

    /// Refuses a registration when the table is full.
    fn check_room(&self) -> Result<(), VerbsError> {
        if self.regions.len() + self.windows.len() >= self.max_regions as usize {
            return Err(VerbsError::new(
                VERB_REG,
                Errno::ENOMEM,
                format!("too many memory regions (limit {})", self.max_regions),
            ));
        }
        Ok(())
    }

    /// Gives `mem` a fresh key and inserts it.
    fn insert(
        &mut self,
        pd: PdId,
        mem: Mem,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MrInfo, VerbsError> {
        let max = self.max_regions;
        let full = || {
            VerbsError::new(
                VERB_REG,
                Errno::ENOMEM,
                format!("too many memory regions (limit {max})"),
            )
        };
        let key = self.fresh_key().ok_or_else(full)?;
        let index = key >> 8;
        let info = MrInfo {
            lkey: key,
            rkey: key,
            addr: iova,
            length: addr_u64(mem.len)?,
            access,
            pd,
        };
        self.regions.insert(
            index,
            Region {
                info,
                mem,
                windows: 0,
                dm: None,
            },
        );
        Ok(info)
    }

    /// The next free index, cycling through `1..=max_regions`.
    /// A key for a new region or window: the next free index and a random
    /// key byte other than the one that index had last. `None` when full.
    fn fresh_key(&mut self) -> Option<u32> {
        let index = self.alloc_index()?;
        let slot = usize::try_from(index - 1).ok()?;
        if self.key_bytes.len() <= slot {
            self.key_bytes.resize(slot + 1, 0);
        }
        let last = self.key_bytes[slot];
        let byte = loop {
            let b = (crate::rng::splitmix64(&mut self.key_rng) >> 56) as u8;
            if b != last {
                break b;
            }
        };
        self.key_bytes[slot] = byte;
        Some((index << 8) | u32::from(byte))
    }

    fn alloc_index(&mut self) -> Option<u32> {
        if self.regions.len() + self.windows.len() >= self.max_regions as usize {
            return None;
        }
        for _ in 0..self.max_regions {
            let index = self.next_index;
            self.next_index = if index >= self.max_regions {
                1
            } else {
                index + 1
            };
            if !self.regions.contains_key(&index) && !self.windows.contains_key(&index) {
                return Some(index);
            }
        }
        None
    }

    /// The live region `key` names.
    fn lookup(&self, key: u32) -> Result<&Region, AccessError> {
        match self.regions.get(&(key >> 8)) {
            Some(region) if region.info.lkey == key => Ok(region),
            _ => Err(AccessError::BadKey),
        }
    }

    /// The live owned region `lkey` names.
    fn lookup_owned(&self, lkey: u32) -> Result<&Region, AccessError> {
        let region = self.lookup(lkey)?;
        match region.mem.owned_words {
            Some(_) => Ok(region),
            None => Err(AccessError::BadKey),
        }
    }

    /// Checks key, PD, access and range; returns the region and the byte
    /// offset of `va` in it.
    fn resolve(
        &self,
        key: u32,
        pd: PdId,
        need: AccessFlags,
        va: u64,
        len: u64,
    ) -> Result<(&Region, usize), AccessError> {
        let region = self.lookup(key)?;
        let off = region.check(pd, need, va, len)?;
        Ok((region, off))
    }

    /// What a remote key names, checked for a remote access: a region
    /// (key, PD, right, range), or a memory window (its current key, bound,
    /// PD, type 2's QP, the window's rights and bounds), then the region
    /// it is bound into (its range).
    fn resolve_remote(
        &self,
        key: u32,
        by: RemoteQp,
        need: AccessFlags,
        va: u64,
        len: u64,
    ) -> Result<(&Region, usize), AccessError> {
        let Some(w) = self.windows.get(&(key >> 8)) else {
            return self.resolve(key, by.pd, need, va, len);
        };
        if w.rkey != key {
            return Err(AccessError::BadKey);
        }
        let b = w.binding.as_ref().ok_or(AccessError::BadKey)?;
        if w.pd != by.pd {
            return Err(AccessError::WrongPd);
        }
        if w.kind == MwType::Type2 && b.qpn != by.qpn {
            return Err(AccessError::WrongQp);
        }
        if !b.access.contains(need) {
            return Err(AccessError::NoPermission);
        }
        let inside = va
            .checked_sub(b.addr)
            .and_then(|off| off.checked_add(len))
            .is_some_and(|end| end <= b.length);
        if !inside {
            return Err(AccessError::OutOfRange);
        }
        let region = self.lookup(b.mr_key)?;
        let off = region.check(region.info.pd, AccessFlags::NONE, va, len)?;
        Ok((region, off))
    }

    /// `ibv_alloc_mw`: an unbound window of `kind` in `pd`. Returns its
    /// key. `ENOMEM` when the table is full.
    pub fn alloc_window(&mut self, pd: PdId, kind: MwType) -> Result<u32, VerbsError> {
        let max = self.max_regions;
        let full = || {
            VerbsError::new(
                "ibv_alloc_mw",
                Errno::ENOMEM,
                format!("too many memory regions and windows (limit {max})"),
            )
        };
        let rkey = self.fresh_key().ok_or_else(full)?;
        let index = rkey >> 8;
        self.windows.insert(
            index,
            Window {
                rkey,
                pd,
                kind,
                binding: None,
            },
        );
        Ok(rkey)
    }

    /// `ibv_dealloc_mw`: the window whose key (any key it had: the index
    /// names it) is `key` goes, unbinding it first. `EINVAL` for no such
    /// window.
    pub fn dealloc_window(&mut self, key: u32) -> Result<(), VerbsError> {
        let w = self.windows.remove(&(key >> 8)).ok_or_else(|| {
            VerbsError::new(
                "ibv_dealloc_mw",
                Errno::EINVAL,
                format!("no memory window with key {key:#x}"),
            )
        })?;
        if let Some(b) = w.binding {
            self.unbound_from(b.mr_key);
        }
        Ok(())
    }

    /// The window's type and current key.
    pub fn window(&self, key: u32) -> Option<(MwType, u32)> {
        self.windows.get(&(key >> 8)).map(|w| (w.kind, w.rkey))
    }

    fn unbound_from(&mut self, mr_key: u32) {
        if let Some(r) = self.regions.get_mut(&(mr_key >> 8)) {
            if r.info.lkey == mr_key {
                r.windows = r.windows.saturating_sub(1);
            }
        }
    }

    /// Execute a bind (a BIND_MW work request, or `ibv_bind_mw` for a
    /// type 1 window) posted on QP `by`, with rxe's checks (`rxe_check_bind_mw`): the
    /// window's key is current and the new key keeps its index; type 1 may
    /// be rebound (a zero length unbinds it), type 2 must be unbound,
    /// belong to the QP's PD and get a non-zero length; the region is live,
    /// in the window's PD, grants `MW_BIND` (and `LOCAL_WRITE` when remote
    /// write or atomic rights are asked), is not zero-based, and holds the
    /// whole window. On success the window has the new key.
    pub fn bind_window(&mut self, by: RemoteQp, bind: &MwBind) -> Result<(), WindowError> {
        let index = bind.mw_rkey >> 8;
        let w = self.windows.get(&index).ok_or(WindowError::BadKey)?;
        if w.rkey != bind.mw_rkey {
            return Err(WindowError::BadKey);
        }
        if bind.new_rkey >> 8 != index {
            return Err(WindowError::KeyIndex);
        }
        if bind.access.contains(AccessFlags::ZERO_BASED) {
            return Err(WindowError::ZeroBased);
        }
        // Only the remote rights mean anything for a window; others (the
        // LOCAL_WRITE pyverbs passes, say) are ignored, as rxe does.
        let remote =
            AccessFlags::REMOTE_READ.0 | AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0;
        let bind = &MwBind {
            access: AccessFlags(bind.access.0 & remote),
            ..*bind
        };
        let (kind, pd) = (w.kind, w.pd);
        match kind {
            MwType::Type1 if bind.length == 0 => {
                // Unbind.
                let old = self.windows.get_mut(&index).and_then(|w| {
                    w.rkey = bind.new_rkey;
                    w.binding.take()
                });
                if let Some(b) = old {
                    self.unbound_from(b.mr_key);
                }
                return Ok(());
            }
            MwType::Type1 => {}
            MwType::Type2 => {
                if w.binding.is_some() {
                    return Err(WindowError::State);
                }
                if by.pd != pd {
                    return Err(WindowError::WrongPd);
                }
                if bind.length == 0 {
                    return Err(WindowError::OutOfRange);
                }
            }
        }
        let r = self.lookup(bind.mr_lkey).map_err(|_| WindowError::BadKey)?;
        if r.info.pd != pd {
            return Err(WindowError::WrongPd);
        }
        if r.info.access.contains(AccessFlags::ZERO_BASED) {
            return Err(WindowError::ZeroBased);
        }
        if !r.info.access.contains(AccessFlags::MW_BIND) {
            return Err(WindowError::Access);
        }
        let writes = AccessFlags(AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0);
        if bind.access.0 & writes.0 != 0 && !r.info.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(WindowError::Access);
        }
        r.check(pd, AccessFlags::NONE, bind.addr, bind.length)
            .map_err(|_| WindowError::OutOfRange)?;
        let binding = Binding {
            mr_key: bind.mr_lkey,
            addr: bind.addr,
            length: bind.length,
            access: bind.access,
            qpn: match kind {
                MwType::Type1 => None,
                MwType::Type2 => by.qpn,
            },
        };
        if let Some(r) = self.regions.get_mut(&(bind.mr_lkey >> 8)) {
            r.windows += 1;
        }
        let old = self.windows.get_mut(&index).and_then(|w| {
            w.rkey = bind.new_rkey;
            w.binding.replace(binding)
        });
        if let Some(b) = old {
            self.unbound_from(b.mr_key);
        }
        Ok(())
    }

    /// Invalidate `key` for QP `by` (LOCAL_INV, or the IETH of a
    /// SEND_WITH_INV): a type 2 window bound through that QP is unbound
    /// and its key stops working. Type 1 windows cannot be invalidated,
    /// and roxe's regions are not fast-registration regions, so neither
    /// can they (as rxe's `rxe_invalidate_mr`).
    pub fn invalidate(&mut self, key: u32, by: RemoteQp) -> Result<(), WindowError> {
        let index = key >> 8;
        let Some(w) = self.windows.get_mut(&index) else {
            return Err(match self.lookup(key) {
                Ok(_) => WindowError::State,
                Err(_) => WindowError::BadKey,
            });
        };
        if w.rkey != key {
            return Err(WindowError::BadKey);
        }
        if w.kind != MwType::Type2 {
            return Err(WindowError::State);
        }
        let Some(b) = w.binding else {
            return Err(WindowError::State);
        };
        if b.qpn != by.qpn {
            return Err(WindowError::WrongQp);
        }
        w.binding = None;
        self.unbound_from(b.mr_key);
        Ok(())
    }

    /// An incoming ATOMIC WRITE: the 8 bytes at `va` replaced by `value`
    /// (native order: the payload's bytes) in one atomic store. Needs
    /// remote write access over the 8 bytes and an 8-byte aligned `va`.
    pub fn atomic_write(
        &mut self,
        rkey: u32,
        by: impl Into<RemoteQp>,
        va: u64,
        value: u64,
    ) -> Result<(), AccessError> {
        self.atomic(rkey, by.into(), va, AtomicOp::Store { value })
            .map(|_| ())
    }

    fn atomic(
        &mut self,
        rkey: u32,
        by: RemoteQp,
        va: u64,
        op: AtomicOp,
    ) -> Result<u64, AccessError> {
        let need = match op {
            AtomicOp::Store { .. } => AccessFlags::REMOTE_WRITE,
            _ => AccessFlags::REMOTE_ATOMIC,
        };
        let (region, off) = self.resolve_remote(rkey, by, need, va, 8)?;
        if va & 7 != 0 {
            return Err(AccessError::Misaligned);
        }
        region.mem.atomic(off, op)
    }

    /// Calls `visit(region, offset in region, range of the caller's buffer)`
    /// for each piece of `[offset, offset + len)` of the SGE list's
    /// concatenation, after checking the piece's key, PD, `need` and range.
    fn walk_sges(
        &self,
        pd: PdId,
        sges: &[Sge],
        offset: usize,
        len: usize,
        need: AccessFlags,
        mut visit: impl FnMut(&Region, usize, std::ops::Range<usize>) -> Result<(), AccessError>,
    ) -> Result<(), AccessError> {
        let start = u64::try_from(offset).map_err(|_| AccessError::OutOfRange)?;
        let end = start
            .checked_add(u64::try_from(len).map_err(|_| AccessError::OutOfRange)?)
            .ok_or(AccessError::OutOfRange)?;
        if end > Self::sge_total(sges) {
            return Err(AccessError::OutOfRange);
        }
        if start == end {
            return Ok(());
        }
        // Start of the current SGE in the concatenation, and how much of
        // the caller's buffer is done.
        let mut pos = 0u64;
        let mut done = 0usize;
        for sge in sges {
            if pos >= end {
                break;
            }
            let sge_end = pos
                .checked_add(u64::from(sge.length))
                .ok_or(AccessError::OutOfRange)?;
            if sge_end > start && sge.length != 0 {
                // Bytes [from, to) of this SGE are wanted.
                let from = start.max(pos) - pos;
                let to = end.min(sge_end) - pos;
                let piece = to - from;
                let va = sge.addr.checked_add(from).ok_or(AccessError::OutOfRange)?;
                let (region, off) = self.resolve(sge.lkey, pd, need, va, piece)?;
                let piece = usize::try_from(piece).map_err(|_| AccessError::OutOfRange)?;
                let next = done.checked_add(piece).ok_or(AccessError::OutOfRange)?;
                visit(region, off, done..next)?;
                done = next;
            }
            pos = sge_end;
        }
        Ok(())
    }
}

/// Validates registration access flags: returns them with unknown optional
/// bits dropped.
fn check_access(access: AccessFlags) -> Result<AccessFlags, VerbsError> {
    if access.contains(AccessFlags::ON_DEMAND) {
        return Err(VerbsError::new(
            VERB_REG,
            Errno::EOPNOTSUPP,
            "on-demand paging is not supported",
        ));
    }
    let optional = access.0 & OPTIONAL_ACCESS_RANGE;
    let mandatory = access.0 & !OPTIONAL_ACCESS_RANGE;
    if mandatory & !SUPPORTED_ACCESS != 0 {
        return Err(VerbsError::new(
            VERB_REG,
            Errno::EINVAL,
            format!("unknown access flags {:#x}", mandatory & !SUPPORTED_ACCESS),
        ));
    }
    if (access.contains(AccessFlags::REMOTE_WRITE) || access.contains(AccessFlags::REMOTE_ATOMIC))
        && !access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(VerbsError::new(
            VERB_REG,
            Errno::EINVAL,
            "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE",
        ));
    }
    Ok(AccessFlags(
        mandatory | (optional & AccessFlags::RELAXED_ORDERING.0),
    ))
}

/// A host address or length as a `u64` (`EINVAL` on a >64-bit platform).
fn addr_u64(value: usize) -> Result<u64, VerbsError> {
    u64::try_from(value)
        .map_err(|_| VerbsError::new(VERB_REG, Errno::EINVAL, "address does not fit 64 bits"))
}

/// A slice's length as a `u64`.
fn slice_len(buf: &[u8]) -> Result<u64, AccessError> {
    u64::try_from(buf.len()).map_err(|_| AccessError::OutOfRange)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PD: PdId = PdId(1);
    const OTHER_PD: PdId = PdId(2);
    const LW: AccessFlags = AccessFlags::LOCAL_WRITE;
    const RW: AccessFlags = AccessFlags::REMOTE_WRITE;
    const RR: AccessFlags = AccessFlags::REMOTE_READ;
    const RA: AccessFlags = AccessFlags::REMOTE_ATOMIC;

    fn all() -> AccessFlags {
        LW | RW | RR | RA
    }

    fn owned(t: &mut MemoryTable, len: usize, access: AccessFlags) -> MrInfo {
        t.register_owned(PD, len, access).expect("register_owned")
    }

    fn errno(r: Result<MrInfo, VerbsError>) -> Errno {
        r.expect_err("registration must fail").errno
    }

    #[test]
    fn table_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<MemoryTable>();
    }

    #[test]
    fn register_query_deregister() {
        let mut t = MemoryTable::default();
        let mr = owned(&mut t, 100, all());
        assert_eq!(mr.lkey, mr.rkey);
        assert_ne!(mr.lkey, 0);
        assert_eq!(mr.length, 100);
        assert_eq!(mr.pd, PD);
        assert_eq!(mr.access, all());
        assert_eq!(mr.addr % 8, 0, "owned buffers are 8-byte aligned");
        assert_eq!(t.query(mr.lkey), Some(mr));
        assert_eq!(t.region_count(), 1);
        let mut out = [0xffu8; 100];
        t.owned_read(mr.lkey, 0, &mut out).unwrap();
        assert_eq!(out, [0u8; 100], "owned buffers start zeroed");
        t.owned_write(mr.lkey, 10, b"hello").unwrap();
        let mut out = [0u8; 5];
        t.remote_read(mr.rkey, PD, mr.addr + 10, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert_eq!(
            t.owned_write(mr.lkey, 96, b"hello"),
            Err(AccessError::OutOfRange)
        );
        assert_eq!(
            t.owned_read(mr.lkey, usize::MAX, &mut out),
            Err(AccessError::OutOfRange)
        );
        t.deregister(mr.lkey).unwrap();
        assert_eq!(t.query(mr.lkey), None);
        assert_eq!(t.region_count(), 0);
        assert_eq!(t.owned_read(mr.lkey, 0, &mut out), Err(AccessError::BadKey));
        assert_eq!(
            t.remote_read(mr.rkey, PD, mr.addr, &mut out),
            Err(AccessError::BadKey)
        );
    }

    #[test]
    fn deregister_errors() {
        let mut t = MemoryTable::new();
        let mr = owned(&mut t, 8, LW);
        for key in [0, 1, 0xff, mr.lkey ^ 1, mr.lkey + 0x100, u32::MAX] {
            let e = t.deregister(key).unwrap_err();
            assert_eq!(e.errno, Errno::EINVAL);
            assert_eq!(e.verb, "ibv_dereg_mr");
        }
        t.deregister(mr.lkey).unwrap();
        assert_eq!(t.deregister(mr.lkey).unwrap_err().errno, Errno::EINVAL);
    }

    #[test]
    fn register_access_rules() {
        let mut t = MemoryTable::new();
        // The libibverbs / rxe rule.
        assert_eq!(errno(t.register_owned(PD, 8, RW)), Errno::EINVAL);
        assert_eq!(errno(t.register_owned(PD, 8, RA)), Errno::EINVAL);
        assert_eq!(errno(t.register_owned(PD, 8, RW | RR | RA)), Errno::EINVAL);
        // Unknown bits.
        for bit in [8, 9, 10, 15, 19, 30, 31] {
            assert_eq!(
                errno(t.register_owned(PD, 8, LW | AccessFlags(1 << bit))),
                Errno::EINVAL,
                "bit {bit}"
            );
        }
        assert_eq!(
            errno(t.register_owned(PD, 8, LW | AccessFlags::ON_DEMAND)),
            Errno::EOPNOTSUPP
        );
        assert_eq!(t.region_count(), 0);
        // Accepted combinations.
        for access in [
            AccessFlags::NONE,
            RR,
            LW,
            LW | RW,
            LW | RA,
            all(),
            all() | AccessFlags::MW_BIND | AccessFlags::HUGETLB,
            all() | AccessFlags::RELAXED_ORDERING,
        ] {
            let mr = t.register_owned(PD, 8, access).unwrap();
            assert_eq!(mr.access, access);
        }
        // Optional-range bits roxe does not know are accepted and dropped.
        let mr = t.register_owned(PD, 8, LW | AccessFlags(1 << 25)).unwrap();
        assert_eq!(mr.access, LW);
    }

    #[test]
    fn register_limit_is_enomem() {
        let mut t = MemoryTable::with_max_regions(3);
        let a = owned(&mut t, 8, LW);
        let _b = owned(&mut t, 8, LW);
        let _c = owned(&mut t, 8, LW);
        assert_eq!(errno(t.register_owned(PD, 8, LW)), Errno::ENOMEM);
        let mut word = 0u64;
        // SAFETY: refused (table full), so the memory is never registered.
        let r = unsafe { t.register_raw(PD, std::ptr::addr_of_mut!(word).cast(), 8, 0, LW) };
        assert_eq!(errno(r), Errno::ENOMEM);
        t.deregister(a.lkey).unwrap();
        let d = owned(&mut t, 8, LW);
        assert_eq!(d.lkey >> 8, a.lkey >> 8, "the only free index is reused");
        assert_ne!(d.lkey, a.lkey);
        // The clamp: at least one region.
        let mut t = MemoryTable::with_max_regions(0);
        owned(&mut t, 1, LW);
        assert_eq!(errno(t.register_owned(PD, 1, LW)), Errno::ENOMEM);
    }

    #[test]
    fn huge_owned_registration_is_enomem() {
        let mut t = MemoryTable::new();
        for len in [usize::MAX, usize::MAX - 7, isize::MAX as usize + 1] {
            assert_eq!(errno(t.register_owned(PD, len, LW)), Errno::ENOMEM);
        }
        assert_eq!(t.region_count(), 0);
    }

    #[test]
    fn zero_length_region() {
        let mut t = MemoryTable::new();
        let mr = owned(&mut t, 0, all());
        assert_eq!(mr.length, 0);
        t.remote_write(mr.rkey, PD, mr.addr, &[]).unwrap();
        assert_eq!(
            t.remote_write(mr.rkey, PD, mr.addr, &[1]),
            Err(AccessError::OutOfRange)
        );
        assert_eq!(
            t.atomic_fetch_add(mr.rkey, PD, mr.addr, 1),
            Err(AccessError::OutOfRange)
        );
        t.deregister(mr.lkey).unwrap();
    }

    #[test]
    fn keys_unique_nonzero_and_cyclic() {
        let mut t = MemoryTable::new();
        let mut keys = std::collections::HashSet::new();
        for _ in 0..1000 {
            let mr = owned(&mut t, 1, LW);
            assert_ne!(mr.lkey, 0);
            assert!(keys.insert(mr.lkey), "duplicate key {:#x}", mr.lkey);
        }
        // A freed index is not reused while others are free.
        let mut t = MemoryTable::with_max_regions(4);
        let a = owned(&mut t, 1, LW);
        t.deregister(a.lkey).unwrap();
        let b = owned(&mut t, 1, LW);
        assert_ne!(b.lkey >> 8, a.lkey >> 8);
    }

    #[test]
    fn stale_keys_refused_after_slot_reuse() {
        // One index only: every registration reuses the same slot, with a
        // random key byte that is never the previous one.
        let mut t = MemoryTable::with_max_regions(1);
        let mut prev: Option<MrInfo> = None;
        let mut bytes = Vec::new();
        for _ in 0..300 {
            let mr = owned(&mut t, 16, all());
            assert_ne!(mr.lkey, 0);
            bytes.push(mr.lkey as u8);
            if let Some(old) = prev {
                assert_eq!(mr.lkey >> 8, old.lkey >> 8, "same slot");
                assert_ne!(old.lkey, mr.lkey);
                assert_eq!(t.query(old.lkey), None);
                let mut out = [0u8; 8];
                assert_eq!(
                    t.remote_read(old.rkey, PD, mr.addr, &mut out),
                    Err(AccessError::BadKey)
                );
                assert_eq!(
                    t.remote_write(old.rkey, PD, mr.addr, &out),
                    Err(AccessError::BadKey)
                );
                assert_eq!(
                    t.atomic_fetch_add(old.rkey, PD, mr.addr, 1),
                    Err(AccessError::BadKey)
                );
                let sge = Sge {
                    addr: mr.addr,
                    length: 8,
                    lkey: old.lkey,
                };
                assert_eq!(t.gather(PD, &[sge], 0, &mut out), Err(AccessError::BadKey));
                assert_eq!(t.deregister(old.lkey).unwrap_err().errno, Errno::EINVAL);
            }
            t.deregister(mr.lkey).unwrap();
            prev = Some(mr);
        }
        // Not a counter: the next byte does not follow from the last (a
        // sequence of +1 steps throughout has probability 255^-299).
        let steps = bytes
            .windows(2)
            .filter(|w| w[1] == w[0].wrapping_add(1))
            .count();
        assert!(steps < bytes.len() - 1, "key bytes count up: {bytes:?}");
        let distinct: std::collections::BTreeSet<u8> = bytes.iter().copied().collect();
        assert!(distinct.len() > 64, "{} distinct key bytes", distinct.len());
    }

    /// A region with a distinct byte pattern, plus the refused-access
    /// fixtures around it.
    fn patterned(t: &mut MemoryTable, len: usize, access: AccessFlags, seed: u8) -> MrInfo {
        let mr = owned(t, len, access);
        let data: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
        t.owned_write(mr.lkey, 0, &data).unwrap();
        mr
    }

    #[test]
    fn reregistration_changes_pd_access_and_translation_keeping_keys() {
        let mut t = MemoryTable::new();
        let mr = owned(&mut t, 64, all());
        let data = [7u8; 8];
        // Access: without REMOTE_WRITE the rkey no longer writes.
        let info = t.reregister(mr.lkey, None, Some(LW | RR)).unwrap();
        assert_eq!((info.lkey, info.rkey), (mr.lkey, mr.rkey));
        assert_eq!(
            t.remote_write(mr.rkey, PD, mr.addr, &data),
            Err(AccessError::NoPermission)
        );
        // PD: the old PD's QPs are refused, the new one's served.
        t.reregister(mr.lkey, Some(OTHER_PD), Some(all())).unwrap();
        assert_eq!(
            t.remote_write(mr.rkey, PD, mr.addr, &data),
            Err(AccessError::WrongPd)
        );
        t.remote_write(mr.rkey, OTHER_PD, mr.addr, &data).unwrap();
        // Bad input changes nothing.
        assert!(t
            .reregister(mr.lkey, Some(PD), Some(AccessFlags::REMOTE_WRITE))
            .is_err());
        assert!(t.reregister(mr.lkey ^ 0x80, Some(PD), None).is_err());
        assert_eq!(t.query(mr.lkey).unwrap().pd, OTHER_PD);
        // Translation: new memory at a new iova; the old range is gone.
        let mut buf = vec![0u64; 4];
        let ptr = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: `buf` outlives the region (deregistered below) and is
        // not touched while registered.
        let info = unsafe {
            t.reregister_translation(mr.lkey, ptr, 32, 0x1000, Some(PD), None)
                .unwrap()
        };
        assert_eq!((info.addr, info.length, info.lkey), (0x1000, 32, mr.lkey));
        t.remote_write(mr.rkey, PD, 0x1000 + 8, &data).unwrap();
        assert_eq!(
            t.remote_write(mr.rkey, PD, mr.addr, &data),
            Err(AccessError::OutOfRange)
        );
        t.deregister(mr.lkey).unwrap();
        assert_eq!(buf[1].to_ne_bytes(), data);
    }

    #[test]
    fn remote_write_and_read_errors() {
        let mut t = MemoryTable::new();
        let mr = patterned(&mut t, 64, all(), 0);
        let read_only = patterned(&mut t, 64, LW | RR, 0);
        let write_only = patterned(&mut t, 64, LW | RW, 0);
        let dead = owned(&mut t, 64, all());
        t.deregister(dead.lkey).unwrap();
        let mut out = [0u8; 8];
        let data = [0xaau8; 8];
        let end = mr.addr + mr.length;

        // Success at both edges.
        t.remote_write(mr.rkey, PD, mr.addr, &data).unwrap();
        t.remote_write(mr.rkey, PD, end - 8, &data).unwrap();
        t.remote_read(mr.rkey, PD, end - 8, &mut out).unwrap();
        assert_eq!(out, data);
        t.remote_read(mr.rkey, PD, mr.addr + 8, &mut out).unwrap();
        assert_eq!(out, [8, 9, 10, 11, 12, 13, 14, 15]);
        // Empty accesses at the very end are inside.
        t.remote_write(mr.rkey, PD, end, &[]).unwrap();
        t.remote_read(mr.rkey, PD, end, &mut []).unwrap();

        let cases: [(u32, PdId, u64, AccessError); 11] = [
            (0, PD, mr.addr, AccessError::BadKey),
            (0xdead_beef, PD, mr.addr, AccessError::BadKey),
            (mr.rkey ^ 0x80, PD, mr.addr, AccessError::BadKey),
            (dead.rkey, PD, dead.addr, AccessError::BadKey),
            (mr.rkey, OTHER_PD, mr.addr, AccessError::WrongPd),
            (mr.rkey, PD, mr.addr - 1, AccessError::OutOfRange),
            (mr.rkey, PD, 0, AccessError::OutOfRange),
            (mr.rkey, PD, end - 7, AccessError::OutOfRange),
            (mr.rkey, PD, end, AccessError::OutOfRange),
            (mr.rkey, PD, u64::MAX - 3, AccessError::OutOfRange),
            (mr.rkey, PD, u64::MAX, AccessError::OutOfRange),
        ];
        for (key, pd, va, want) in cases {
            assert_eq!(
                t.remote_write(key, pd, va, &data),
                Err(want),
                "write {key:#x} {va:#x}"
            );
            assert_eq!(
                t.remote_read(key, pd, va, &mut out),
                Err(want),
                "read {key:#x} {va:#x}"
            );
            assert_eq!(t.check_remote(key, pd, va, 8, RW), Err(want));
            assert_eq!(t.check_remote(key, pd, va, 8, RR), Err(want));
        }
        // Missing rights.
        assert_eq!(
            t.remote_write(read_only.rkey, PD, read_only.addr, &data),
            Err(AccessError::NoPermission)
        );
        assert_eq!(
            t.remote_read(write_only.rkey, PD, write_only.addr, &mut out),
            Err(AccessError::NoPermission)
        );
        assert_eq!(
            t.check_remote(read_only.rkey, PD, read_only.addr, 8, RW),
            Err(AccessError::NoPermission)
        );
        assert_eq!(
            t.check_remote(write_only.rkey, PD, write_only.addr, 8, RR),
            Err(AccessError::NoPermission)
        );
        // Refused writes changed nothing.
        let mut all_bytes = [0u8; 64];
        t.owned_read(read_only.lkey, 0, &mut all_bytes).unwrap();
        assert!(all_bytes.iter().enumerate().all(|(i, &b)| b == i as u8));
        // Empty accesses still need a valid key and an address inside.
        assert_eq!(
            t.remote_write(mr.rkey, PD, end + 1, &[]),
            Err(AccessError::OutOfRange)
        );
        assert_eq!(
            t.remote_read(0, PD, mr.addr, &mut []),
            Err(AccessError::BadKey)
        );
    }

    #[test]
    fn check_remote_whole_range() {
        let mut t = MemoryTable::new();
        let mr = owned(&mut t, 4096, all());
        t.check_remote(mr.rkey, PD, mr.addr, 4096, RW | RR).unwrap();
        t.check_remote(mr.rkey, PD, mr.addr + 4095, 1, RA).unwrap();
        assert_eq!(
            t.check_remote(mr.rkey, PD, mr.addr, 4097, RW),
            Err(AccessError::OutOfRange)
        );
        assert_eq!(
            t.check_remote(mr.rkey, PD, mr.addr + 1, u64::MAX, RW),
            Err(AccessError::OutOfRange)
        );
        assert_eq!(
            t.check_remote(mr.rkey, PD, mr.addr, 16, RW | AccessFlags::MW_BIND),
            Err(AccessError::NoPermission)
        );
    }

    #[test]
    fn zero_length_remote_access_needs_no_key_only_in_check_remote() {
        let mut t = MemoryTable::new();
        let mr = owned(&mut t, 16, LW);
        for key in [0, 0xdead_beef, mr.rkey, u32::MAX] {
            for va in [0, 1, u64::MAX] {
                t.check_remote(key, OTHER_PD, va, 0, all()).unwrap();
            }
        }
        assert_eq!(
            t.remote_write(0xdead_beef, PD, 0, &[]),
            Err(AccessError::BadKey)
        );
        assert_eq!(
            t.remote_read(0xdead_beef, PD, 0, &mut []),
            Err(AccessError::BadKey)
        );
        assert_eq!(
            t.check_remote(0xdead_beef, PD, 0, 1, RR),
            Err(AccessError::BadKey)
        );
    }

    #[test]
    fn atomics_semantics() {
        let mut t = MemoryTable::new();
        let mr = owned(&mut t, 32, all());
        let va = mr.addr + 8;
        t.owned_write(mr.lkey, 8, &5u64.to_ne_bytes()).unwrap();
        // Compare-and-swap miss leaves the word.
        assert_eq!(t.atomic_cmp_swap(mr.rkey, PD, va, 4, 9), Ok(5));
        assert_eq!(t.atomic_fetch_add(mr.rkey, PD, va, 0), Ok(5));
        // Hit swaps.
        assert_eq!(t.atomic_cmp_swap(mr.rkey, PD, va, 5, 9), Ok(5));
        let mut word = [0u8; 8];
        t.owned_read(mr.lkey, 8, &mut word).unwrap();
        assert_eq!(u64::from_ne_bytes(word), 9, "host (native) byte order");
        // Fetch-add wraps.
        assert_eq!(t.atomic_cmp_swap(mr.rkey, PD, va, 9, u64::MAX - 1), Ok(9));
        assert_eq!(t.atomic_fetch_add(mr.rkey, PD, va, 3), Ok(u64::MAX - 1));
        assert_eq!(t.atomic_fetch_add(mr.rkey, PD, va, 0), Ok(1));
        // Neighbours untouched; last word usable.
        t.owned_read(mr.lkey, 0, &mut word).unwrap();
        assert_eq!(word, [0; 8]);
        assert_eq!(t.atomic_fetch_add(mr.rkey, PD, mr.addr + 24, 7), Ok(0));
        t.owned_read(mr.lkey, 16, &mut word).unwrap();
        assert_eq!(word, [0; 8]);
    }

    #[test]
    fn atomic_errors() {
        let mut t = MemoryTable::new();
        let mr = owned(&mut t, 32, all());
        let no_atomic = owned(&mut t, 32, LW | RW | RR);
        let dead = owned(&mut t, 32, all());
        t.deregister(dead.lkey).unwrap();
        let end = mr.addr + 32;
        let cases: [(u32, PdId, u64, AccessError); 11] = [
            (0, PD, mr.addr, AccessError::BadKey),
            (0x1234_5678, PD, mr.addr, AccessError::BadKey),
            (dead.rkey, PD, dead.addr, AccessError::BadKey),
            (mr.rkey, OTHER_PD, mr.addr, AccessError::WrongPd),
            (
                no_atomic.rkey,
                PD,
                no_atomic.addr,
                AccessError::NoPermission,
            ),
            (mr.rkey, PD, mr.addr + 4, AccessError::Misaligned),
            (mr.rkey, PD, mr.addr + 1, AccessError::Misaligned),
            (mr.rkey, PD, end, AccessError::OutOfRange),
            // Range is checked before alignment, as rxe does.
            (mr.rkey, PD, end - 4, AccessError::OutOfRange),
            (mr.rkey, PD, mr.addr - 8, AccessError::OutOfRange),
            (mr.rkey, PD, u64::MAX - 7, AccessError::OutOfRange),
        ];
        for (key, pd, va, want) in cases {
            assert_eq!(
                t.atomic_cmp_swap(key, pd, va, 0, 1),
                Err(want),
                "cas {va:#x}"
            );
            assert_eq!(t.atomic_fetch_add(key, pd, va, 1), Err(want), "add {va:#x}");
        }
        let mut bytes = [0xffu8; 32];
        t.owned_read(mr.lkey, 0, &mut bytes).unwrap();
        assert_eq!(bytes, [0; 32], "refused atomics changed nothing");
    }

    #[test]
    fn zero_based_regions() {
        let mut t = MemoryTable::new();
        let mr = owned(&mut t, 16, all() | AccessFlags::ZERO_BASED);
        assert_eq!(mr.addr, 0);
        t.remote_write(mr.rkey, PD, 4, b"abcd").unwrap();
        assert_eq!(t.atomic_fetch_add(mr.rkey, PD, 8, 1), Ok(0));
        let mut out = [0u8; 4];
        t.owned_read(mr.lkey, 4, &mut out).unwrap();
        assert_eq!(&out, b"abcd");
        assert_eq!(
            t.remote_write(mr.rkey, PD, 13, b"abcd"),
            Err(AccessError::OutOfRange)
        );
        let mut backing = [0u64; 2];
        // SAFETY: refused (ZERO_BASED with a non-zero iova), never accessed.
        let r = unsafe {
            t.register_raw(
                PD,
                backing.as_mut_ptr().cast(),
                16,
                0x1000,
                all() | AccessFlags::ZERO_BASED,
            )
        };
        assert_eq!(errno(r), Errno::EINVAL);
    }

    #[test]
    fn on_demand_regions_follow_the_mapping_and_never_fault() {
        let mut t = MemoryTable::new();
        let pd = PdId(1);
        let rw = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        // An explicit region over a buffer of ours.
        let buf = vec![0u64; 64];
        let addr = buf.as_ptr() as usize;
        let mr = t
            .register_odp(pd, addr, 512, addr as u64, rw | AccessFlags::ON_DEMAND)
            .unwrap();
        assert!(mr.access.contains(AccessFlags::ON_DEMAND));
        t.remote_write(mr.rkey, pd, mr.addr + 8, &[1, 2, 3, 4, 5, 6, 7, 8])
            .unwrap();
        let mut back = [0u8; 8];
        t.remote_read(mr.rkey, pd, mr.addr + 8, &mut back).unwrap();
        assert_eq!(back, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(t.atomic_fetch_add(mr.rkey, pd, mr.addr + 16, 5), Ok(0));
        assert_eq!(t.atomic_cmp_swap(mr.rkey, pd, mr.addr + 16, 5, 9), Ok(5));
        assert_eq!(t.atomic_fetch_add(mr.rkey, pd, mr.addr + 16, 0), Ok(9));
        assert_eq!(
            t.atomic_fetch_add(mr.rkey, pd, mr.addr + 12, 1),
            Err(AccessError::Misaligned)
        );
        // Bounds still hold.
        assert_eq!(
            t.remote_write(mr.rkey, pd, mr.addr + 510, &[0; 4]),
            Err(AccessError::OutOfRange)
        );
        drop(buf);
        t.deregister(mr.lkey).unwrap();

        // An implicit region: the whole address space. A page that cannot
        // be accessed, and one that is read-only, are errors, never a
        // fault. (The first page is made inaccessible rather than
        // unmapped: tests running beside this one may map the freed
        // address again at once.)
        let implicit = t
            .register_odp(pd, 0, usize::MAX, 0, rw | AccessFlags::ON_DEMAND)
            .unwrap();
        let mut local = [0u8; 16];
        let at = local.as_mut_ptr() as u64;
        t.remote_write(implicit.rkey, pd, at, &[7; 16]).unwrap();
        assert_eq!(local, [7; 16]);
        // SAFETY: a fresh anonymous mapping of two pages, owned by this
        // test; the first is made inaccessible below, the second
        // read-only.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED);
        let p = page as u64;
        // SAFETY: both pages are this test's mapping.
        unsafe {
            assert_eq!(libc::mprotect(page, 4096, libc::PROT_NONE), 0);
            assert_eq!(
                libc::mprotect(page.cast::<u8>().add(4096).cast(), 4096, libc::PROT_READ),
                0
            );
        }
        assert_eq!(
            t.remote_write(implicit.rkey, pd, p, &[1; 8]),
            Err(AccessError::Unmapped)
        );
        let mut out = [0u8; 8];
        assert_eq!(
            t.remote_read(implicit.rkey, pd, p, &mut out),
            Err(AccessError::Unmapped)
        );
        assert_eq!(
            t.remote_write(implicit.rkey, pd, p + 4096, &[1; 8]),
            Err(AccessError::Unmapped)
        );
        t.remote_read(implicit.rkey, pd, p + 4096, &mut out)
            .unwrap();
        assert_eq!(out, [0; 8]);
        assert_eq!(
            t.atomic_fetch_add(implicit.rkey, pd, p, 1),
            Err(AccessError::Unmapped)
        );
        // SAFETY: the test's mapping, no longer used.
        unsafe { libc::munmap(page, 8192) };
    }

    #[test]
    fn raw_region_sees_remote_writes() {
        let mut backing: Vec<u64> = vec![0; 8];
        backing[0] = u64::from_ne_bytes(*b"initial!");
        let mut t = MemoryTable::new();
        let ptr = backing.as_mut_ptr().cast::<u8>();
        // SAFETY: `backing` outlives the registration (deregistered below
        // before it is touched again) and nothing else references it
        // meanwhile.
        let mr = unsafe { t.register_raw(PD, ptr, 64, 0x10_0000, all()) }.unwrap();
        assert_eq!(mr.addr, 0x10_0000);
        assert_eq!(mr.length, 64);
        let mut out = [0u8; 8];
        t.remote_read(mr.rkey, PD, 0x10_0000, &mut out).unwrap();
        assert_eq!(&out, b"initial!");
        t.remote_write(mr.rkey, PD, 0x10_0008, &7u64.to_ne_bytes())
            .unwrap();
        assert_eq!(t.atomic_fetch_add(mr.rkey, PD, 0x10_0008, 5), Ok(7));
        assert_eq!(t.atomic_cmp_swap(mr.rkey, PD, 0x10_0038, 0, 42), Ok(0));
        let sge = Sge {
            addr: 0x10_0010,
            length: 16,
            lkey: mr.lkey,
        };
        t.scatter(PD, &[sge], 3, b"xyz").unwrap();
        assert_eq!(
            t.remote_write(mr.rkey, PD, 0x10_0039, &[0; 8]),
            Err(AccessError::OutOfRange)
        );
        // Owned-buffer accessors do not apply to raw regions.
        assert_eq!(t.owned_read(mr.lkey, 0, &mut out), Err(AccessError::BadKey));
        assert_eq!(t.owned_write(mr.lkey, 0, &out), Err(AccessError::BadKey));
        t.deregister(mr.lkey).unwrap();
        assert_eq!(backing[1], 12);
        assert_eq!(backing[7], 42);
        assert_eq!(&backing[2].to_ne_bytes()[3..6], b"xyz");
        assert_eq!(&backing[0].to_ne_bytes(), b"initial!");
    }

    #[test]
    fn raw_region_registration_errors() {
        let mut t = MemoryTable::new();
        let mut backing = [0u64; 4];
        let ptr = backing.as_mut_ptr().cast::<u8>();
        // SAFETY (all calls below): every registration is refused, so the
        // memory is never accessed.
        unsafe {
            assert_eq!(
                errno(t.register_raw(PD, std::ptr::null_mut(), 8, 0, LW)),
                Errno::EINVAL
            );
            assert_eq!(
                errno(t.register_raw(PD, ptr, 32, u64::MAX - 30, LW)),
                Errno::EINVAL
            );
            assert_eq!(
                errno(t.register_raw(PD, ptr, usize::MAX, 0, LW)),
                Errno::EINVAL
            );
            assert_eq!(errno(t.register_raw(PD, ptr, 32, 0, RW)), Errno::EINVAL);
            assert_eq!(
                errno(t.register_raw(PD, ptr, 32, 0, LW | AccessFlags(1 << 9))),
                Errno::EINVAL
            );
        }
        assert_eq!(t.region_count(), 0);
        // The very top of the iova space is fine.
        // SAFETY: `backing` outlives the registration, deregistered below.
        let mr = unsafe { t.register_raw(PD, ptr, 32, u64::MAX - 32, all()) }.unwrap();
        t.remote_write(mr.rkey, PD, u64::MAX - 8, &[1; 8]).unwrap();
        assert_eq!(
            t.remote_write(mr.rkey, PD, u64::MAX - 7, &[1; 8]),
            Err(AccessError::OutOfRange)
        );
        t.deregister(mr.lkey).unwrap();
        assert_eq!(backing[3].to_ne_bytes()[7], 1);
    }

    #[test]
    fn raw_atomic_needs_host_alignment() {
        let mut backing = [0u64; 4];
        let mut t = MemoryTable::new();
        let ptr = backing.as_mut_ptr().cast::<u8>().wrapping_add(4);
        // SAFETY: `ptr..ptr + 24` lies in `backing`, which outlives the
        // registration (deregistered below).
        let mr = unsafe { t.register_raw(PD, ptr, 24, 0x2000, all()) }.unwrap();
        // The iova is aligned but the host word is not.
        assert_eq!(
            t.atomic_fetch_add(mr.rkey, PD, 0x2000, 1),
            Err(AccessError::Misaligned)
        );
        assert_eq!(
            t.atomic_cmp_swap(mr.rkey, PD, 0x2008, 0, 1),
            Err(AccessError::Misaligned)
        );
        t.deregister(mr.lkey).unwrap();
        assert_eq!(backing, [0; 4]);
    }

    /// Three SGEs over two regions (one region used twice), and the
    /// reference concatenation of their bytes as (region lkey, offset).
    fn three_sges(t: &mut MemoryTable) -> (Vec<Sge>, Vec<(u32, usize)>) {
        let a = patterned(t, 32, LW, 0x10);
        let b = patterned(t, 16, LW, 0x80);
        let parts = [(a, 3usize, 5u32), (b, 0, 7), (a, 20, 4)];
        let mut sges = Vec::new();
        let mut map = Vec::new();
        for (mr, off, len) in parts {
            sges.push(Sge {
                addr: mr.addr + off as u64,
                length: len,
                lkey: mr.lkey,
            });
            map.extend((0..len as usize).map(|i| (mr.lkey, off + i)));
        }
        (sges, map)
    }

    fn region_bytes(t: &MemoryTable, lkey: u32) -> Vec<u8> {
        let len = usize::try_from(t.query(lkey).unwrap().length).unwrap();
        let mut out = vec![0; len];
        t.owned_read(lkey, 0, &mut out).unwrap();
        out
    }

    #[test]
    fn payload_by_reference_is_the_gathered_bytes_with_the_same_checks() {
        let mut t = MemoryTable::new();
        let (sges, map) = three_sges(&mut t);
        let total = map.len();
        for offset in 0..=total + 1 {
            for len in 0..=total + 1 - offset.min(total + 1) {
                let mut out = vec![0u8; len];
                let copied = t.gather(PD, &sges, offset, &mut out);
                let by_ref = t.gather_ref(PD, &sges, offset, len);
                match (copied, by_ref) {
                    (Err(a), Err(b)) => assert_eq!(a, b, "{offset}+{len}"),
                    (Ok(()), Ok(Some(r))) => {
                        // SAFETY: the table is unchanged since.
                        let bytes = unsafe { r.bytes() };
                        assert_eq!(bytes, &out[..], "{offset}+{len}");
                        // One piece: inside one SGE.
                        let first = map[offset];
                        assert!(map[offset..offset + len]
                            .iter()
                            .enumerate()
                            .all(|(i, &(k, o))| k == first.0 && o == first.1 + i));
                    }
                    // Several pieces (or none): gathered.
                    (Ok(()), Ok(None)) => {
                        let one_piece = len > 0
                            && sges
                                .iter()
                                .scan(0usize, |pos, s| {
                                    let start = *pos;
                                    *pos += s.length as usize;
                                    Some((start, *pos))
                                })
                                .any(|(a, b)| a <= offset && offset + len <= b);
                        assert!(!one_piece, "{offset}+{len} lies in one SGE");
                    }
                    (a, b) => panic!("{offset}+{len}: gather {a:?}, by reference {b:?}"),
                }
            }
        }
        // The wrong PD is refused by reference too.
        let r = t.gather_ref(OTHER_PD, &sges, 0, 4);
        assert_eq!(r, t.gather(OTHER_PD, &sges, 0, &mut [0; 4]).map(|_| None));
        // A remote READ by reference: the bytes, and remote_read's errors.
        let mr = patterned(&mut t, 64, LW | RR, 0x40);
        let r = t
            .remote_read_ref(mr.rkey, PD, mr.addr + 8, 16)
            .unwrap()
            .unwrap();
        let mut out = [0u8; 16];
        t.remote_read(mr.rkey, PD, mr.addr + 8, &mut out).unwrap();
        // SAFETY: the table is unchanged since.
        assert_eq!(unsafe { r.bytes() }, &out);
        for (key, pd, va, len) in [
            (mr.rkey, PD, mr.addr + 60, 8),
            (mr.rkey, OTHER_PD, mr.addr, 8),
            (mr.rkey ^ 0x100, PD, mr.addr, 8),
        ] {
            let mut out = vec![0u8; len];
            let want = t.remote_read(key, pd, va, &mut out).unwrap_err();
            assert_eq!(t.remote_read_ref(key, pd, va, len), Err(want));
        }
        let no_read = patterned(&mut t, 64, LW | RW, 0);
        assert_eq!(
            t.remote_read_ref(no_read.rkey, PD, no_read.addr, 8),
            Err(AccessError::NoPermission)
        );
    }

    #[test]
    fn gather_and_scatter_at_every_offset() {
        let mut t = MemoryTable::new();
        let (sges, map) = three_sges(&mut t);
        let total = map.len();
        assert_eq!(MemoryTable::sge_total(&sges), total as u64);
        let lkeys: Vec<u32> = {
            let mut k: Vec<u32> = map.iter().map(|&(k, _)| k).collect();
            k.dedup();
            k.sort_unstable();
            k.dedup();
            k
        };
        let pristine: Vec<(u32, Vec<u8>)> =
            lkeys.iter().map(|&k| (k, region_bytes(&t, k))).collect();
        let concat: Vec<u8> = map
            .iter()
            .map(|&(k, off)| pristine.iter().find(|p| p.0 == k).unwrap().1[off])
            .collect();
        for offset in 0..=total + 1 {
            for len in 0..=total + 1 - offset.min(total + 1) {
                for (k, bytes) in &pristine {
                    t.owned_write(*k, 0, bytes).unwrap();
                }
                let mut out = vec![0u8; len];
                let r = t.gather(PD, &sges, offset, &mut out);
                if offset + len > total {
                    assert_eq!(r, Err(AccessError::OutOfRange), "{offset}+{len}");
                    continue;
                }
                r.unwrap();
                assert_eq!(out, concat[offset..offset + len], "gather {offset}+{len}");

                // Scatter into the pristine regions; compare with a model.
                let data: Vec<u8> = (0..len).map(|i| 0xe0 ^ i as u8).collect();
                t.scatter(PD, &sges, offset, &data).unwrap();
                let mut model = pristine.clone();
                for (i, &byte) in data.iter().enumerate() {
                    let (k, off) = map[offset + i];
                    model.iter_mut().find(|p| p.0 == k).unwrap().1[off] = byte;
                }
                for (k, bytes) in &model {
                    assert_eq!(&region_bytes(&t, *k), bytes, "scatter {offset}+{len}");
                }
            }
        }
        assert_eq!(
            t.scatter(PD, &sges, usize::MAX, &[1]),
            Err(AccessError::OutOfRange)
        );
        assert_eq!(
            t.gather(PD, &sges, usize::MAX, &mut []),
            Err(AccessError::OutOfRange)
        );
        // Empty requests at the end succeed.
        t.gather(PD, &sges, total, &mut []).unwrap();
        t.scatter(PD, &[], 0, &[]).unwrap();
    }

    #[test]
    fn gather_scatter_errors() {
        let mut t = MemoryTable::new();
        let good = patterned(&mut t, 32, LW, 0);
        let read_only = patterned(&mut t, 32, RR, 0);
        let other = t.register_owned(OTHER_PD, 32, LW).unwrap();
        let sge = |mr: MrInfo, off: u64, len: u32| Sge {
            addr: mr.addr + off,
            length: len,
            lkey: mr.lkey,
        };
        let bad = Sge {
            addr: good.addr,
            length: 8,
            lkey: 0xbad_0000,
        };
        let mut out = [0u8; 24];
        let cases: [(Sge, AccessError); 6] = [
            (bad, AccessError::BadKey),
            (Sge { lkey: 0, ..bad }, AccessError::BadKey),
            (sge(other, 0, 8), AccessError::WrongPd),
            (sge(good, 28, 8), AccessError::OutOfRange),
            (
                Sge {
                    addr: good.addr - 1,
                    ..sge(good, 0, 8)
                },
                AccessError::OutOfRange,
            ),
            (
                Sge {
                    addr: u64::MAX - 3,
                    ..sge(good, 0, 8)
                },
                AccessError::OutOfRange,
            ),
        ];
        for (middle, want) in cases {
            let sges = [sge(good, 0, 8), middle, sge(good, 16, 8)];
            assert_eq!(t.gather(PD, &sges, 0, &mut out), Err(want), "{middle:?}");
            assert_eq!(t.scatter(PD, &sges, 0, &[9; 24]), Err(want), "{middle:?}");
            assert_eq!(t.scatter(PD, &sges, 6, &[9; 12]), Err(want), "{middle:?}");
            // A refused scatter writes nothing, not even the first SGE.
            assert_eq!(region_bytes(&t, good.lkey)[..8], [0, 1, 2, 3, 4, 5, 6, 7]);
            // Untouched SGEs are not examined.
            t.gather(PD, &sges, 0, &mut out[..8]).unwrap();
            t.gather(PD, &sges, 16, &mut out[..8]).unwrap();
            t.scatter(PD, &sges, 0, &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
            // Nor are any with an empty request inside one.
            t.gather(PD, &sges, 10, &mut []).unwrap();
        }
        // Reads need no right; writes need LOCAL_WRITE.
        let ro = [sge(read_only, 4, 8)];
        t.gather(PD, &ro, 0, &mut out[..8]).unwrap();
        assert_eq!(out[..8], [4, 5, 6, 7, 8, 9, 10, 11]);
        assert_eq!(
            t.scatter(PD, &ro, 0, &[1; 8]),
            Err(AccessError::NoPermission)
        );
        assert_eq!(region_bytes(&t, read_only.lkey)[4], 4);
        // Zero-length SGEs are skipped unexamined.
        let sges = [
            Sge { length: 0, ..bad },
            sge(good, 8, 4),
            Sge { length: 0, ..bad },
        ];
        t.gather(PD, &sges, 0, &mut out[..4]).unwrap();
        assert_eq!(out[..4], [8, 9, 10, 11]);
        t.scatter(PD, &sges, 0, &[1; 4]).unwrap();
    }

    #[test]
    fn sge_total_saturates() {
        assert_eq!(MemoryTable::sge_total(&[]), 0);
        let sge = Sge {
            addr: 0,
            length: u32::MAX,
            lkey: 1,
        };
        assert_eq!(MemoryTable::sge_total(&[sge, sge]), 2 * u64::from(u32::MAX));
    }

    // ---- model check ----

    /// Which key an access uses: mostly the key of its target region.
    #[derive(Debug, Clone)]
    enum KeySel {
        Target,
        Known(usize),
        /// The target's index with another key byte.
        Regen(u8),
        Any(u32),
    }

    /// Which address an access uses: mostly near its target region.
    #[derive(Debug, Clone)]
    enum VaSel {
        Target(i64),
        Rel(usize, i64),
        Any(u64),
        Top(u8),
    }

    /// An access aimed at region `target` (whose key, PD and address it
    /// mostly uses, so that many accesses succeed).
    #[derive(Debug, Clone)]
    struct Aim {
        target: usize,
        key: KeySel,
        va: VaSel,
    }

    #[derive(Debug, Clone)]
    struct Op {
        kind: u8,
        aim: Aim,
        /// `None`: the target's PD.
        pd: Option<u32>,
        len: u64,
        a: u64,
        b: u64,
        sges: Vec<(Aim, u32)>,
    }

    fn aim() -> impl Strategy<Value = Aim> {
        let key = prop_oneof![
            12 => Just(KeySel::Target),
            2 => any::<usize>().prop_map(KeySel::Known),
            1 => any::<u8>().prop_map(KeySel::Regen),
            1 => any::<u32>().prop_map(KeySel::Any),
        ];
        let va = prop_oneof![
            8 => (0i64..24).prop_map(VaSel::Target),
            4 => (0i64..4).prop_map(|w| VaSel::Target(8 * w)),
            4 => (-12i64..72).prop_map(VaSel::Target),
            2 => (any::<usize>(), -12i64..72).prop_map(|(r, d)| VaSel::Rel(r, d)),
            1 => any::<u64>().prop_map(VaSel::Any),
            1 => any::<u8>().prop_map(VaSel::Top),
        ];
        (any::<usize>(), key, va).prop_map(|(target, key, va)| Aim { target, key, va })
    }

    fn op() -> impl Strategy<Value = Op> {
        // Deregistration (kind 5) is rare, or little else would succeed.
        let kind = prop_oneof![
            1 => Just(5u8),
            40 => (0u8..7).prop_map(|k| if k == 5 { 7 } else { k }),
        ];
        (
            kind,
            aim(),
            prop_oneof![6 => Just(None), 1 => (1u32..=3).prop_map(Some)],
            prop_oneof![6 => 0u64..9, 3 => 0u64..72, 1 => any::<u64>()],
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec((aim(), prop_oneof![3 => 0u32..16, 1 => 0u32..80]), 0..4),
        )
            .prop_map(|(kind, aim, pd, len, a, b, sges)| Op {
                kind,
                aim,
                pd,
                len,
                a,
                b,
                sges,
            })
    }

    struct ModelRegion {
        info: MrInfo,
        host: usize,
        bytes: Vec<u8>,
        live: bool,
    }

    struct Model {
        regions: Vec<ModelRegion>,
    }

    impl Model {
        fn info(&self, i: usize) -> MrInfo {
            self.regions[i % self.regions.len()].info
        }

        fn key(&self, aim: &Aim) -> u32 {
            match aim.key {
                KeySel::Target => self.info(aim.target).lkey,
                KeySel::Known(i) => self.info(i).lkey,
                KeySel::Regen(b) => (self.info(aim.target).lkey & !0xff) | u32::from(b),
                KeySel::Any(k) => k,
            }
        }

        fn va(&self, aim: &Aim) -> u64 {
            match aim.va {
                VaSel::Target(d) => self.info(aim.target).addr.wrapping_add(d as u64),
                VaSel::Rel(i, d) => self.info(i).addr.wrapping_add(d as u64),
                VaSel::Any(v) => v,
                VaSel::Top(x) => u64::MAX - u64::from(x),
            }
        }

        /// The region index and byte offset, by the plain definition (u128).
        fn resolve(
            &self,
            key: u32,
            pd: PdId,
            need: AccessFlags,
            va: u64,
            len: u64,
        ) -> Result<(usize, usize), AccessError> {
            let r = self
                .regions
                .iter()
                .position(|r| r.live && r.info.lkey == key)
                .ok_or(AccessError::BadKey)?;
            let info = self.regions[r].info;
            if info.pd != pd {
                return Err(AccessError::WrongPd);
            }
            if info.access.0 & need.0 != need.0 {
                return Err(AccessError::NoPermission);
            }
            let (va, len, addr, length) = (
                u128::from(va),
                u128::from(len),
                u128::from(info.addr),
                u128::from(info.length),
            );
            if va < addr || va + len > addr + length {
                return Err(AccessError::OutOfRange);
            }
            Ok((r, (va - addr) as usize))
        }

        fn atomic(&self, key: u32, pd: PdId, va: u64) -> Result<(usize, usize), AccessError> {
            let (r, off) = self.resolve(key, pd, RA, va, 8)?;
            if va & 7 != 0 || (self.regions[r].host + off) & 7 != 0 {
                return Err(AccessError::Misaligned);
            }
            Ok((r, off))
        }

        fn word(&self, r: usize, off: usize) -> u64 {
            u64::from_ne_bytes(self.regions[r].bytes[off..off + 8].try_into().unwrap())
        }

        /// Pieces (region, offset, buffer start, length) of a gather/scatter.
        #[allow(clippy::type_complexity)]
        fn sg(
            &self,
            pd: PdId,
            sges: &[Sge],
            offset: u64,
            len: u64,
            need: AccessFlags,
        ) -> Result<Vec<(usize, usize, usize, usize)>, AccessError> {
            let total: u128 = sges.iter().map(|s| u128::from(s.length)).sum();
            let (start, end) = (u128::from(offset), u128::from(offset) + u128::from(len));
            if end > total {
                return Err(AccessError::OutOfRange);
            }
            let mut pieces = Vec::new();
            let mut pos = 0u128;
            for s in sges {
                let s_end = pos + u128::from(s.length);
                let (lo, hi) = (start.max(pos), end.min(s_end));
                if lo < hi {
                    let va = u128::from(s.addr) + (lo - pos);
                    let va = u64::try_from(va).map_err(|_| AccessError::OutOfRange)?;
                    let (r, off) = self.resolve(s.lkey, pd, need, va, (hi - lo) as u64)?;
                    pieces.push((r, off, (lo - start) as usize, (hi - lo) as usize));
                }
                pos = s_end;
            }
            Ok(pieces)
        }
    }

    fn run_model(ops: &[Op]) -> Result<(), TestCaseError> {
        // Raw backings outlive the table (declared first, dropped last).
        let mut top_backing = vec![0u64; 8];
        let mut odd_backing = vec![0u64; 5];
        let mut t = MemoryTable::new();
        let mut regions = Vec::new();
        let add_owned = |t: &mut MemoryTable, pd: PdId, len: usize, access: AccessFlags| {
            let info = t.register_owned(pd, len, access).unwrap();
            ModelRegion {
                info,
                host: usize::try_from(info.addr).unwrap_or(0),
                bytes: vec![0; len],
                live: true,
            }
        };
        regions.push(add_owned(&mut t, PD, 64, all()));
        regions.push(add_owned(&mut t, PD, 40, LW | RR));
        regions.push(add_owned(&mut t, OTHER_PD, 24, LW | RW | RA));
        let mut zb = add_owned(&mut t, PD, 16, all() | AccessFlags::ZERO_BASED);
        zb.host = 0; // owned buffers are 8-byte aligned
        regions.push(zb);
        let mut dead = add_owned(&mut t, PD, 32, all());
        t.deregister(dead.info.lkey).unwrap();
        dead.live = false;
        regions.push(dead);
        regions.push(add_owned(&mut t, PD, 0, all()));
        regions.push(add_owned(&mut t, PD, 8, RR));
        let top_ptr = top_backing.as_mut_ptr().cast::<u8>();
        // SAFETY: `top_backing` outlives the table and is not touched until
        // the region is deregistered at the end.
        let info = unsafe { t.register_raw(PD, top_ptr, 64, u64::MAX - 71, all()) }.unwrap();
        regions.push(ModelRegion {
            info,
            host: top_ptr as usize,
            bytes: vec![0; 64],
            live: true,
        });
        let odd_ptr = odd_backing.as_mut_ptr().cast::<u8>().wrapping_add(1);
        // SAFETY: as above; `odd_ptr..odd_ptr + 32` lies inside `odd_backing`.
        let info = unsafe { t.register_raw(PD, odd_ptr, 32, 0x1003, all()) }.unwrap();
        regions.push(ModelRegion {
            info,
            host: odd_ptr as usize,
            bytes: vec![0; 32],
            live: true,
        });
        let mut m = Model { regions };

        for op in ops {
            let key = m.key(&op.aim);
            let pd = op.pd.map_or(m.info(op.aim.target).pd, PdId);
            let va = m.va(&op.aim);
            let small = usize::try_from(op.len % 100).unwrap();
            match op.kind {
                0 => {
                    let data: Vec<u8> = (0..small).map(|i| (op.a as u8) ^ (i as u8)).collect();
                    let want = m.resolve(key, pd, RW, va, small as u64);
                    let got = t.remote_write(key, pd, va, &data);
                    prop_assert_eq!(got, want.map(|_| ()));
                    if let Ok((r, off)) = want {
                        m.regions[r].bytes[off..off + small].copy_from_slice(&data);
                    }
                }
                1 => {
                    let mut out = vec![0u8; small];
                    let want = m.resolve(key, pd, RR, va, small as u64);
                    let got = t.remote_read(key, pd, va, &mut out);
                    prop_assert_eq!(got, want.map(|_| ()));
                    if let Ok((r, off)) = want {
                        prop_assert_eq!(&out[..], &m.regions[r].bytes[off..off + small]);
                    }
                }
                2 => {
                    let need = AccessFlags((op.a as u32) & 0xf);
                    let want = if op.len == 0 {
                        Ok(())
                    } else {
                        m.resolve(key, pd, need, va, op.len).map(|_| ())
                    };
                    prop_assert_eq!(t.check_remote(key, pd, va, op.len, need), want);
                }
                3 => {
                    let want = m.atomic(key, pd, va);
                    let compare = match want {
                        Ok((r, off)) if op.a & 1 == 0 => m.word(r, off),
                        _ => op.a,
                    };
                    let got = t.atomic_cmp_swap(key, pd, va, compare, op.b);
                    match want {
                        Ok((r, off)) => {
                            let old = m.word(r, off);
                            prop_assert_eq!(got, Ok(old));
                            if old == compare {
                                m.regions[r].bytes[off..off + 8]
                                    .copy_from_slice(&op.b.to_ne_bytes());
                            }
                        }
                        Err(e) => prop_assert_eq!(got, Err(e)),
                    }
                }
                4 => {
                    let want = m.atomic(key, pd, va);
                    let got = t.atomic_fetch_add(key, pd, va, op.b);
                    match want {
                        Ok((r, off)) => {
                            let old = m.word(r, off);
                            prop_assert_eq!(got, Ok(old));
                            let new = old.wrapping_add(op.b);
                            m.regions[r].bytes[off..off + 8].copy_from_slice(&new.to_ne_bytes());
                        }
                        Err(e) => prop_assert_eq!(got, Err(e)),
                    }
                }
                5 => {
                    let live = m.regions.iter().position(|r| r.live && r.info.lkey == key);
                    let got = t.deregister(key);
                    prop_assert_eq!(got.is_ok(), live.is_some());
                    if let Some(r) = live {
                        m.regions[r].live = false;
                        prop_assert_eq!(t.query(key), None);
                    }
                }
                6 | 7 => {
                    let sges: Vec<Sge> = op
                        .sges
                        .iter()
                        .map(|(aim, length)| Sge {
                            addr: m.va(aim),
                            length: *length,
                            lkey: m.key(aim),
                        })
                        .collect();
                    let offset = op.a % 16;
                    let len = usize::try_from(op.b % 24).unwrap();
                    let offset_us = usize::try_from(offset).unwrap();
                    if op.kind == 6 {
                        let want = m.sg(pd, &sges, offset, len as u64, AccessFlags::NONE);
                        let mut out = vec![0u8; len];
                        let got = t.gather(pd, &sges, offset_us, &mut out);
                        prop_assert_eq!(got, want.as_ref().map(|_| ()).map_err(|e| *e));
                        if let Ok(pieces) = want {
                            for (r, off, at, n) in pieces {
                                prop_assert_eq!(
                                    &out[at..at + n],
                                    &m.regions[r].bytes[off..off + n]
                                );
                            }
                        }
                    } else {
                        let want = m.sg(pd, &sges, offset, len as u64, LW);
                        let data: Vec<u8> = (0..len).map(|i| (op.len as u8) ^ (i as u8)).collect();
                        let got = t.scatter(pd, &sges, offset_us, &data);
                        prop_assert_eq!(got, want.as_ref().map(|_| ()).map_err(|e| *e));
                        if let Ok(pieces) = want {
                            for (r, off, at, n) in pieces {
                                m.regions[r].bytes[off..off + n].copy_from_slice(&data[at..at + n]);
                            }
                        }
                    }
                }
                _ => unreachable!(),
            }
        }

        // Final contents: owned regions through the table, raw ones through
        // their backings after deregistration.
        for r in &m.regions {
            if r.live && r.info.addr != u64::MAX - 71 && r.info.addr != 0x1003 {
                let mut out = vec![0u8; r.bytes.len()];
                t.owned_read(r.info.lkey, 0, &mut out).unwrap();
                prop_assert_eq!(&out, &r.bytes);
            }
        }
        for r in &m.regions {
            if r.live {
                t.deregister(r.info.lkey).unwrap();
            }
        }
        prop_assert_eq!(t.region_count(), 0);
        let top: Vec<u8> = top_backing.iter().flat_map(|w| w.to_ne_bytes()).collect();
        prop_assert_eq!(&top[..], &m.regions[7].bytes[..]);
        let odd: Vec<u8> = odd_backing.iter().flat_map(|w| w.to_ne_bytes()).collect();
        prop_assert_eq!(&odd[1..33], &m.regions[8].bytes[..]);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Random keys, addresses and lengths never panic, and every
        /// access agrees with a plain model of the regions: it succeeds
        /// exactly when the model says so, with the same error otherwise,
        /// and moves the same bytes.
        #[test]
        fn accesses_match_model(ops in proptest::collection::vec(op(), 1..64)) {
            run_model(&ops)?;
        }
    }
}
