//! The hardware backend's objects: a real device's context, PDs, CQs,
//! completion channels, QPs, MRs, SRQs and AHs, each owning the pointer
//! the system library returned and destroying it on drop.
//!
//! Every object holds an `Arc` of its [`HwContext`], so the device is
//! closed only after its last object is gone; the public types (one module
//! per object: `pd.rs`, `qp.rs`, ...) hold their parents (a QP its PD and
//! CQs, ...) on both backends, so a parent is never destroyed under a
//! child. The data path
//! (`post_send`, `post_recv`, `post_srq_recv`, `poll_cq`,
//! `req_notify_cq`) jumps through the context's ops table, as
//! libibverbs' inline functions do; everything else calls the library's
//! exported verbs.

use super::SystemVerbs;
use crate::abi::convert::{av_to_c, qp_attr_from_c, qp_attr_to_c, wc_from_c};
use crate::abi::*;
use crate::{
    AddressVector, AttrMask, DeviceAttr, Errno, Error, Mtu, PortAttr, QpAttr, QpEvent, QpType,
    RecvWr, SendFlags, SendWr, Sge, VerbsError, WorkCompletion,
};
use parking_lot::Mutex;
use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::net::IpAddr;
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Weak};

fn err(verb: &'static str, errno: c_int, detail: impl Into<String>) -> Error {
    Error::Verbs(VerbsError::new(verb, Errno(errno), detail))
}

/// The errno a verb that returned NULL left (EIO if it left none).
fn last_errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .filter(|&e| e != 0)
        .unwrap_or(libc::EIO)
}

/// A verb's integer result (0 or an errno; some providers return -1 with
/// errno set) as a Result.
fn check(verb: &'static str, rc: c_int) -> Result<(), Error> {
    match rc {
        0 => Ok(()),
        -1 => Err(err(verb, last_errno(), "the system library refused it")),
        e => Err(err(verb, e.abs(), "the system library refused it")),
    }
}

/// An open real device (`struct ibv_context` of the system library).
pub(crate) struct HwContext {
    pub(crate) sys: &'static SystemVerbs,
    ctx: NonNull<ibv_context>,
    /// The GID index [`crate::Qp::endpoint`] and [`crate::Qp::connect`]
    /// use: the first RoCEv2 GID holding an IPv4 address, else the first
    /// RoCEv2 one, else 0 (settable).
    gid_index: AtomicU8,
    /// `ibv_query_device`, read at open.
    pub(crate) attr: DeviceAttr,
    /// The AHs alive on this device by destination address: a UD send
    /// names its destination by address ([`crate::UdDest`]).
    ahs: Mutex<HashMap<IpAddr, Weak<HwAh>>>,
}

// SAFETY: libibverbs objects may be used from any thread (verbs are
// thread-safe, `man ibv_open_device`); the pointer is owned by this value
// and only freed in Drop.
unsafe impl Send for HwContext {}
// SAFETY: as above; the shared state is behind atomics and a Mutex.
unsafe impl Sync for HwContext {}

impl Drop for HwContext {
    fn drop(&mut self) {
        // SAFETY: the context from ibv_open_device, closed once, after
        // every object of it (each holds an Arc of this).
        unsafe { (self.sys.fns.close_device)(self.ctx.as_ptr()) };
    }
}

/// Every CQ's id on the hardware backend (what channel events carry).
static NEXT_CQ_ID: AtomicU32 = AtomicU32::new(0x8000_0000);

impl HwContext {
    /// `ibv_open_device` of the system device named `name`.
    pub(crate) fn open(sys: &'static SystemVerbs, name: &str) -> Result<HwContext, Error> {
        let ctx = sys.with_device(name, |dev| {
            // SAFETY: dev is a device of a live list; opening takes its
            // own reference, so the list may be freed afterwards.
            unsafe { (sys.fns.open_device)(dev) }
        });
        let ctx = match ctx {
            None => {
                return Err(err(
                    "ibv_open_device",
                    libc::ENODEV,
                    format!("no device {name} in {}", sys.path().display()),
                ))
            }
            Some(p) => NonNull::new(p.cast::<ibv_context>())
                .ok_or_else(|| err("ibv_open_device", last_errno(), format!("opening {name}")))?,
        };
        let mut c = HwContext {
            sys,
            ctx,
            gid_index: AtomicU8::new(0),
            attr: DeviceAttr::default(),
            ahs: Mutex::new(HashMap::new()),
        };
        c.attr = c.query_device()?;
        c.gid_index
            .store(c.pick_gid_index().unwrap_or(0), Ordering::Relaxed);
        Ok(c)
    }

    fn raw(&self) -> *mut ibv_context {
        self.ctx.as_ptr()
    }

    fn ops(&self) -> &ibv_context_ops {
        // SAFETY: the context is open; ops is filled by the provider at
        // open and never changes.
        unsafe { &(*self.raw()).ops }
    }

    pub(crate) fn gid_index(&self) -> u8 {
        self.gid_index.load(Ordering::Relaxed)
    }

    pub(crate) fn set_gid_index(&self, index: u8) {
        self.gid_index.store(index, Ordering::Relaxed);
    }

    /// The RoCEv2 GID with an IPv4-mapped address, as rdma_cm would pick
    /// for an IPv4 peer; else the first RoCEv2 GID.
    fn pick_gid_index(&self) -> Option<u8> {
        let len = self.query_port(1).ok()?.gid_tbl_len.min(256);
        let mut first_v2 = None;
        for i in 0..len {
            let Ok(gid) = self.query_gid(1, i) else {
                continue;
            };
            if gid == [0; 16] || !self.is_roce_v2(i) {
                continue;
            }
            first_v2.get_or_insert(i as u8);
            if gid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
                return Some(i as u8);
            }
        }
        first_v2
    }

    /// Whether GID `index` of port 1 is RoCEv2 (`_ibv_query_gid_ex`;
    /// assumed where the library has no such call).
    fn is_roce_v2(&self, index: u32) -> bool {
        let Some(f) = self.sys.fns.query_gid_ex else {
            return true;
        };
        let mut e = ibv_gid_entry::default();
        // SAFETY: an open context and an out-struct of the size passed.
        let rc = unsafe { f(self.raw(), 1, index, &mut e, 0, size_of::<ibv_gid_entry>()) };
        rc == 0 && e.gid_type == IBV_GID_TYPE_ROCE_V2
    }

    fn query_device(&self) -> Result<DeviceAttr, Error> {
        // SAFETY: plain data, all-zero valid.
        let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: an open context and an out-struct of the right type.
        check("ibv_query_device", unsafe {
            (self.sys.fns.query_device)(self.raw(), &mut a)
        })?;
        let u = |v: c_int| u32::try_from(v).unwrap_or(0);
        Ok(DeviceAttr {
            fw_ver: 0,
            node_guid: u64::from_be(a.node_guid),
            max_mr_size: a.max_mr_size,
            page_size_cap: a.page_size_cap,
            vendor_id: a.vendor_id,
            max_qp: u(a.max_qp),
            max_qp_wr: u(a.max_qp_wr),
            max_sge: u(a.max_sge),
            max_cq: u(a.max_cq),
            max_cqe: u(a.max_cqe),
            max_mr: u(a.max_mr),
            max_pd: u(a.max_pd),
            max_qp_rd_atom: u(a.max_qp_rd_atom),
            max_qp_init_rd_atom: u(a.max_qp_init_rd_atom),
            max_srq: u(a.max_srq),
            max_srq_wr: u(a.max_srq_wr),
            max_srq_sge: u(a.max_srq_sge),
            // Not in ibv_device_attr: what QP creation accepts is the
            // truth; rxe and mlx5 take at least this.
            max_inline_data: 64,
            max_pkeys: a.max_pkeys,
            phys_port_cnt: a.phys_port_cnt,
        })
    }

    fn query_port_raw(&self, port: u8) -> Result<ibv_port_attr, Error> {
        let mut a = ibv_port_attr::default();
        // SAFETY: an open context; the buffer is the full struct, larger
        // than the 48 bytes the exported symbol writes.
        check("ibv_query_port", unsafe {
            (self.sys.fns.query_port)(self.raw(), port, &mut a)
        })?;
        Ok(a)
    }

    pub(crate) fn query_port(&self, port: u8) -> Result<PortAttrRaw, Error> {
        let a = self.query_port_raw(port)?;
        Ok(PortAttrRaw {
            gid_tbl_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
            attr: a,
        })
    }

    pub(crate) fn port_attr(&self, port: u8) -> Result<PortAttr, Error> {
        let a = self.query_port_raw(port)?;
        let mtu = |v: u32| Mtu::try_from(v).unwrap_or(Mtu::Mtu1024);
        Ok(PortAttr {
            state: u8::try_from(a.state).unwrap_or(0),
            max_mtu: mtu(a.max_mtu),
            active_mtu: mtu(a.active_mtu),
            gid_tbl_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
            pkey_tbl_len: a.pkey_tbl_len,
            lid: a.lid,
            link_layer: a.link_layer,
            max_msg_sz: a.max_msg_sz,
        })
    }

    pub(crate) fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16], Error> {
        let mut g = ibv_gid::default();
        let index = c_int::try_from(index)
            .map_err(|_| err("ibv_query_gid", libc::EINVAL, "index out of range"))?;
        // SAFETY: an open context and an out-struct of the right type.
        check("ibv_query_gid", unsafe {
            (self.sys.fns.query_gid)(self.raw(), port, index, &mut g)
        })?;
        Ok(g.raw)
    }

    /// The next asynchronous event (`ibv_get_async_event`, acknowledged
    /// at once): QP events name their QP, others QP 0.
    pub(crate) fn get_async_event(&self) -> std::io::Result<QpEvent> {
        let mut ev = ibv_async_event {
            element: null_mut(),
            event_type: 0,
        };
        // SAFETY: an open context and an out-struct of the right type.
        if unsafe { (self.sys.fns.get_async_event)(self.raw(), &mut ev) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // QP events (libibverbs' enum ibv_event_type): the element is the
        // QP. CQ_ERR 0, QP_FATAL 1, QP_REQ_ERR 2, QP_ACCESS_ERR 3,
        // COMM_EST 4, SQ_DRAINED 5, PATH_MIG 6, PATH_MIG_ERR 7,
        // QP_LAST_WQE_REACHED 16.
        let qpn = if matches!(ev.event_type, 1..=7 | 16) && !ev.element.is_null() {
            // SAFETY: for a QP event the element is the live ibv_qp (it
            // cannot be destroyed before the event is acknowledged).
            unsafe { (*ev.element.cast::<ibv_qp>()).qp_num }
        } else {
            0
        };
        let out = QpEvent {
            qpn,
            event_type: ev.event_type,
        };
        // SAFETY: the event just returned, acknowledged once.
        unsafe { (self.sys.fns.ack_async_event)(&mut ev) };
        Ok(out)
    }

    /// The context's async event descriptor.
    pub(crate) fn async_fd(&self) -> c_int {
        // SAFETY: the context is open; the field is set at open.
        unsafe { (*self.raw()).async_fd }
    }

    fn remember_ah(&self, ah: &Arc<HwAh>) {
        let mut m = self.ahs.lock();
        m.retain(|_, w| w.strong_count() > 0);
        m.insert(ah.addr, Arc::downgrade(ah));
    }

    fn ah_for(&self, addr: IpAddr) -> Option<Arc<HwAh>> {
        self.ahs.lock().get(&addr).and_then(Weak::upgrade)
    }
}

/// `ibv_port_attr` with its GID table length.
pub(crate) struct PortAttrRaw {
    pub(crate) gid_tbl_len: u32,
    #[allow(dead_code)]
    pub(crate) attr: ibv_port_attr,
}

/// A PD of a real device.
pub(crate) struct HwPd {
    ctx: Arc<HwContext>,
    pd: NonNull<ibv_pd>,
}

// SAFETY: as for HwContext (thread-safe verbs, owned pointer).
unsafe impl Send for HwPd {}
// SAFETY: as above.
unsafe impl Sync for HwPd {}

impl Drop for HwPd {
    fn drop(&mut self) {
        // SAFETY: the PD from ibv_alloc_pd, freed once, after its objects
        // (each wrapper holds its Pd).
        unsafe { (self.ctx.sys.fns.dealloc_pd)(self.pd.as_ptr()) };
    }
}

impl HwPd {
    pub(crate) fn alloc(ctx: &Arc<HwContext>) -> Result<HwPd, Error> {
        // SAFETY: an open context.
        let pd = unsafe { (ctx.sys.fns.alloc_pd)(ctx.raw()) };
        Ok(HwPd {
            ctx: ctx.clone(),
            pd: NonNull::new(pd)
                .ok_or_else(|| err("ibv_alloc_pd", last_errno(), "allocating a PD"))?,
        })
    }

    /// `ibv_reg_mr` of `len` zeroed bytes this value owns.
    pub(crate) fn reg_owned(&self, len: usize, access: u32) -> Result<HwMr, Error> {
        let buf = OwnedBuf::zeroed(len)
            .ok_or_else(|| err("ibv_reg_mr", libc::ENOMEM, format!("{len} bytes")))?;
        // SAFETY: buf stays allocated until the MR is deregistered (the
        // HwMr drops it after dereg_mr).
        let mut mr = unsafe { self.reg_raw(buf.ptr, len, buf.ptr as u64, access)? };
        mr.owned = Some(buf);
        Ok(mr)
    }

    /// `ibv_reg_mr` (or `ibv_reg_mr_iova` when `iova` is not the address).
    ///
    /// # Safety
    /// `ptr..ptr + len` stays valid until the returned MR is dropped.
    pub(crate) unsafe fn reg_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: u32,
    ) -> Result<HwMr, Error> {
        let access = access as c_int;
        let mr = if iova == ptr as u64 {
            // SAFETY: a live PD; the range is valid per the contract.
            unsafe { (self.ctx.sys.fns.reg_mr)(self.pd.as_ptr(), ptr.cast(), len, access) }
        } else {
            let Some(f) = self.ctx.sys.fns.reg_mr_iova else {
                return Err(err(
                    "ibv_reg_mr_iova",
                    libc::EOPNOTSUPP,
                    "the system library has no ibv_reg_mr_iova",
                ));
            };
            // SAFETY: as above.
            unsafe { f(self.pd.as_ptr(), ptr.cast(), len, iova, access) }
        };
        Ok(HwMr {
            ctx: self.ctx.clone(),
            mr: NonNull::new(mr)
                .ok_or_else(|| err("ibv_reg_mr", last_errno(), format!("{len} bytes")))?,
            owned: None,
        })
    }

    pub(crate) fn create_qp(
        &self,
        qp_type: QpType,
        send_cq: &HwCq,
        recv_cq: &HwCq,
        srq: Option<&HwSrq>,
        cap: ibv_qp_cap,
        sq_sig_all: bool,
    ) -> Result<HwQp, Error> {
        let mut init = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: send_cq.cq.as_ptr(),
            recv_cq: recv_cq.cq.as_ptr(),
            srq: srq.map_or(null_mut(), |s| s.srq.as_ptr()),
            cap,
            qp_type: qp_type as u32,
            sq_sig_all: c_int::from(sq_sig_all),
        };
        // SAFETY: a live PD, CQs and SRQ of this device; init is ours.
        let qp = unsafe { (self.ctx.sys.fns.create_qp)(self.pd.as_ptr(), &mut init) };
        let qp = NonNull::new(qp).ok_or_else(|| {
            err(
                "ibv_create_qp",
                last_errno(),
                format!("{qp_type:?} QP with {cap:?}"),
            )
        })?;
        Ok(HwQp {
            ctx: self.ctx.clone(),
            qp,
            // What the provider granted (it may round up).
            cap: init.cap,
        })
    }

    pub(crate) fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<HwSrq, Error> {
        let mut init = ibv_srq_init_attr {
            srq_context: null_mut(),
            attr: ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: a live PD; init is ours.
        let srq = unsafe { (self.ctx.sys.fns.create_srq)(self.pd.as_ptr(), &mut init) };
        Ok(HwSrq {
            ctx: self.ctx.clone(),
            srq: NonNull::new(srq)
                .ok_or_else(|| err("ibv_create_srq", last_errno(), "creating an SRQ"))?,
        })
    }

    /// `ibv_create_ah`; the AH is also remembered by its destination
    /// address for UD sends that name it.
    pub(crate) fn create_ah(&self, av: &AddressVector) -> Result<Arc<HwAh>, Error> {
        let mut a = av_to_c(av);
        // SAFETY: a live PD; a is ours.
        let ah = unsafe { (self.ctx.sys.fns.create_ah)(self.pd.as_ptr(), &mut a) };
        let ah = Arc::new(HwAh {
            ctx: self.ctx.clone(),
            ah: NonNull::new(ah)
                .ok_or_else(|| err("ibv_create_ah", last_errno(), format!("{av:?}")))?,
            addr: roxe_provider::engine::addr_of_gid(av.dgid),
        });
        self.ctx.remember_ah(&ah);
        Ok(ah)
    }
}

/// A zeroed, page-aligned buffer an owned hardware MR registers.
struct OwnedBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl OwnedBuf {
    fn zeroed(len: usize) -> Option<OwnedBuf> {
        let layout = Layout::from_size_align(len.max(1), 4096).ok()?;
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(OwnedBuf { ptr, layout })
    }
}

impl Drop for OwnedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// An MR of a real device.
pub(crate) struct HwMr {
    ctx: Arc<HwContext>,
    mr: NonNull<ibv_mr>,
    /// Declared after `mr` and freed after `dereg_mr` in Drop.
    owned: Option<OwnedBuf>,
}

// SAFETY: as for HwContext; the owned buffer is only touched through
// read/write, which copy with the same contract as the soft backend's.
unsafe impl Send for HwMr {}
// SAFETY: as above.
unsafe impl Sync for HwMr {}

impl Drop for HwMr {
    fn drop(&mut self) {
        // SAFETY: the MR from ibv_reg_mr, deregistered once, before its
        // buffer (a field, dropped after this) is freed.
        unsafe { (self.ctx.sys.fns.dereg_mr)(self.mr.as_ptr()) };
    }
}

impl HwMr {
    fn c(&self) -> &ibv_mr {
        // SAFETY: registered until Drop; the provider fills it once.
        unsafe { self.mr.as_ref() }
    }
    pub(crate) fn lkey(&self) -> u32 {
        self.c().lkey
    }
    pub(crate) fn rkey(&self) -> u32 {
        self.c().rkey
    }
    pub(crate) fn addr(&self) -> u64 {
        self.c().addr as u64
    }
    pub(crate) fn len(&self) -> usize {
        self.c().length
    }

    /// Copy `out.len()` bytes at `offset` out of an owned region.
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        let (p, _) = self.owned_range("mr.read", offset, out.len())?;
        // SAFETY: in bounds of the owned allocation; the device may write
        // it concurrently, as on the soft backend (the caller reads what a
        // completion announced).
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// The byte at `offset` of an owned region, read anew each call (a
    /// volatile load): what a program polls for a peer's WRITE.
    pub(crate) fn watch_byte(&self, offset: usize) -> Result<u8, Error> {
        let (p, _) = self.owned_range("mr.watch_byte", offset, 1)?;
        // SAFETY: in bounds of the owned allocation; the device writes it
        // by DMA, outside the program's memory model, so a volatile load
        // sees each new value (as a C program's volatile poll does).
        Ok(unsafe { std::ptr::read_volatile(p) })
    }

    /// Copy `data` into an owned region at `offset`.
    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> Result<(), Error> {
        let (p, _) = self.owned_range("mr.write", offset, data.len())?;
        // SAFETY: in bounds of the owned allocation (see read).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    fn owned_range(
        &self,
        verb: &'static str,
        offset: usize,
        n: usize,
    ) -> Result<(*mut u8, usize), Error> {
        let Some(b) = &self.owned else {
            return Err(err(verb, libc::EINVAL, "not a region roxe allocated"));
        };
        let len = self.c().length;
        if offset.checked_add(n).is_none_or(|end| end > len) {
            return Err(err(
                verb,
                libc::EINVAL,
                format!("{offset}+{n} outside {len} bytes"),
            ));
        }
        // SAFETY: offset + n <= len, the allocation's size.
        Ok((unsafe { b.ptr.add(offset) }, len))
    }
}

/// A completion channel of a real device.
pub(crate) struct HwChannel {
    ctx: Arc<HwContext>,
    ch: NonNull<ibv_comp_channel>,
}

// SAFETY: as for HwContext.
unsafe impl Send for HwChannel {}
// SAFETY: as above.
unsafe impl Sync for HwChannel {}

impl Drop for HwChannel {
    fn drop(&mut self) {
        // SAFETY: from ibv_create_comp_channel, destroyed once, after its
        // CQs (each holds an Arc of this).
        unsafe { (self.ctx.sys.fns.destroy_comp_channel)(self.ch.as_ptr()) };
    }
}

impl HwChannel {
    pub(crate) fn create(ctx: &Arc<HwContext>) -> Result<HwChannel, Error> {
        // SAFETY: an open context.
        let ch = unsafe { (ctx.sys.fns.create_comp_channel)(ctx.raw()) };
        Ok(HwChannel {
            ctx: ctx.clone(),
            ch: NonNull::new(ch).ok_or_else(|| {
                err(
                    "ibv_create_comp_channel",
                    last_errno(),
                    "creating a channel",
                )
            })?,
        })
    }

    pub(crate) fn fd(&self) -> c_int {
        // SAFETY: the channel is alive; fd is set at creation.
        unsafe { self.ch.as_ref().fd }
    }

    /// The next event's CQ id (`ibv_get_cq_event`, acknowledged at once:
    /// destroying a CQ waits for its events to be acknowledged).
    pub(crate) fn get_event(&self) -> std::io::Result<u32> {
        let mut cq: *mut ibv_cq = null_mut();
        let mut cq_context: *mut c_void = null_mut();
        // SAFETY: a live channel and out-pointers of the right types.
        if unsafe { (self.ctx.sys.fns.get_cq_event)(self.ch.as_ptr(), &mut cq, &mut cq_context) }
            != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the CQ of the event; alive until acknowledged.
        unsafe { (self.ctx.sys.fns.ack_cq_events)(cq, 1) };
        // The CQ's id rides in cq_context (HwCq::create).
        Ok(cq_context as usize as u32)
    }
}

/// A CQ of a real device.
pub(crate) struct HwCq {
    ctx: Arc<HwContext>,
    cq: NonNull<ibv_cq>,
    pub(crate) id: u32,
    _channel: Option<Arc<HwChannel>>,
}

// SAFETY: as for HwContext.
unsafe impl Send for HwCq {}
// SAFETY: as above.
unsafe impl Sync for HwCq {}

impl Drop for HwCq {
    fn drop(&mut self) {
        // SAFETY: from ibv_create_cq, destroyed once, after its QPs (each
        // holds its Cq); the channel (a field) outlives this call.
        unsafe { (self.ctx.sys.fns.destroy_cq)(self.cq.as_ptr()) };
    }
}

impl HwCq {
    pub(crate) fn create(
        ctx: &Arc<HwContext>,
        depth: u32,
        channel: Option<&Arc<HwChannel>>,
    ) -> Result<HwCq, Error> {
        let id = NEXT_CQ_ID.fetch_add(1, Ordering::Relaxed);
        let depth = c_int::try_from(depth)
            .map_err(|_| err("ibv_create_cq", libc::EINVAL, "depth out of range"))?;
        // SAFETY: an open context; the channel is of the same context
        // (checked by the caller) and alive.
        let cq = unsafe {
            (ctx.sys.fns.create_cq)(
                ctx.raw(),
                depth,
                id as usize as *mut c_void,
                channel.map_or(null_mut(), |c| c.ch.as_ptr()),
                0,
            )
        };
        Ok(HwCq {
            ctx: ctx.clone(),
            cq: NonNull::new(cq)
                .ok_or_else(|| err("ibv_create_cq", last_errno(), format!("{depth} entries")))?,
            id,
            _channel: channel.cloned(),
        })
    }

    /// `ibv_poll_cq` through the provider's ops.
    pub(crate) fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize, Error> {
        let poll = self
            .ctx
            .ops()
            .poll_cq
            .ok_or_else(|| err("ibv_poll_cq", libc::EOPNOTSUPP, "no poll_cq"))?;
        let mut done = 0;
        // Not zeroed: a poller calls this in a tight loop, and the
        // provider writes the entries it returns.
        let mut buf = [const { std::mem::MaybeUninit::<ibv_wc>::uninit() }; 16];
        while done < out.len() {
            let want = (out.len() - done).min(buf.len());
            // SAFETY: a live CQ and a buffer of `want` entries.
            let n = unsafe { poll(self.cq.as_ptr(), want as c_int, buf.as_mut_ptr().cast()) };
            if n < 0 {
                return Err(err("ibv_poll_cq", libc::EIO, "the provider failed"));
            }
            let n = (n as usize).min(want);
            for (o, w) in out[done..].iter_mut().zip(&buf[..n]) {
                // SAFETY: poll_cq wrote its first n entries.
                *o = wc_from_c(unsafe { w.assume_init_ref() });
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    /// `ibv_req_notify_cq` through the provider's ops.
    pub(crate) fn req_notify(&self, solicited_only: bool) -> Result<(), Error> {
        let f = self
            .ctx
            .ops()
            .req_notify_cq
            .ok_or_else(|| err("ibv_req_notify_cq", libc::EOPNOTSUPP, "no req_notify_cq"))?;
        // SAFETY: a live CQ.
        check("ibv_req_notify_cq", unsafe {
            f(self.cq.as_ptr(), c_int::from(solicited_only))
        })
    }
}

/// An SRQ of a real device.
pub(crate) struct HwSrq {
    ctx: Arc<HwContext>,
    srq: NonNull<ibv_srq>,
}

// SAFETY: as for HwContext.
unsafe impl Send for HwSrq {}
// SAFETY: as above.
unsafe impl Sync for HwSrq {}

impl Drop for HwSrq {
    fn drop(&mut self) {
        // SAFETY: from ibv_create_srq, destroyed once, after its QPs.
        unsafe { (self.ctx.sys.fns.destroy_srq)(self.srq.as_ptr()) };
    }
}

impl HwSrq {
    pub(crate) fn post_recv(&self, wr: &RecvWr) -> Result<(), Error> {
        let f = self
            .ctx
            .ops()
            .post_srq_recv
            .ok_or_else(|| err("ibv_post_srq_recv", libc::EOPNOTSUPP, "no post_srq_recv"))?;
        let mut sges = c_sges(&wr.sg_list);
        let mut w = recv_wr_c(wr, sges.as_mut_slice());
        let mut bad = null_mut();
        // SAFETY: a live SRQ; w and its SGEs live across the call.
        check("ibv_post_srq_recv", unsafe {
            f(self.srq.as_ptr(), &mut w, &mut bad)
        })
    }
}

/// An AH of a real device.
pub(crate) struct HwAh {
    ctx: Arc<HwContext>,
    ah: NonNull<ibv_ah>,
    pub(crate) addr: IpAddr,
}

// SAFETY: as for HwContext.
unsafe impl Send for HwAh {}
// SAFETY: as above.
unsafe impl Sync for HwAh {}

impl Drop for HwAh {
    fn drop(&mut self) {
        // SAFETY: from ibv_create_ah, destroyed once.
        unsafe { (self.ctx.sys.fns.destroy_ah)(self.ah.as_ptr()) };
    }
}

/// A QP of a real device.
pub(crate) struct HwQp {
    ctx: Arc<HwContext>,
    qp: NonNull<ibv_qp>,
    cap: ibv_qp_cap,
}

// SAFETY: as for HwContext.
unsafe impl Send for HwQp {}
// SAFETY: as above.
unsafe impl Sync for HwQp {}

impl Drop for HwQp {
    fn drop(&mut self) {
        // SAFETY: from ibv_create_qp, destroyed once, before its PD, CQs
        // and SRQ (the wrapper drops this field first).
        unsafe { (self.ctx.sys.fns.destroy_qp)(self.qp.as_ptr()) };
    }
}

/// A WR's SGEs in C form: on the stack for the usual few, else on the heap
/// (posting is the data path).
enum CSges {
    Few([ibv_sge; 4], usize),
    Many(Vec<ibv_sge>),
}

impl CSges {
    fn new(list: &[Sge]) -> CSges {
        let c = |s: &Sge| ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
        if list.len() <= 4 {
            let mut a = [ibv_sge::default(); 4];
            for (d, s) in a.iter_mut().zip(list) {
                *d = c(s);
            }
            CSges::Few(a, list.len())
        } else {
            CSges::Many(list.iter().map(c).collect())
        }
    }
    fn as_mut_slice(&mut self) -> &mut [ibv_sge] {
        match self {
            CSges::Few(a, n) => &mut a[..*n],
            CSges::Many(v) => v,
        }
    }
}

fn c_sges(list: &[Sge]) -> CSges {
    CSges::new(list)
}

fn recv_wr_c(wr: &RecvWr, sges: &mut [ibv_sge]) -> ibv_recv_wr {
    ibv_recv_wr {
        wr_id: wr.wr_id,
        next: null_mut(),
        sg_list: sges.as_mut_ptr(),
        num_sge: sges.len() as c_int,
    }
}

impl HwQp {
    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: alive until Drop; qp_num is set at creation.
        unsafe { self.qp.as_ref().qp_num }
    }

    pub(crate) fn gid_index(&self) -> u8 {
        self.ctx.gid_index()
    }

    pub(crate) fn cap(&self) -> crate::QpCap {
        let c = self.cap;
        crate::QpCap {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }

    pub(crate) fn context(&self) -> &HwContext {
        &self.ctx
    }

    pub(crate) fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<(), Error> {
        let mut a = qp_attr_to_c(attr, self.cap);
        // SAFETY: a live QP; a is ours.
        check("ibv_modify_qp", unsafe {
            (self.ctx.sys.fns.modify_qp)(self.qp.as_ptr(), &mut a, mask.0 as c_int)
        })
    }

    pub(crate) fn query(&self) -> Result<QpAttr, Error> {
        let mut a = ibv_qp_attr::default();
        // SAFETY: plain data, all-zero valid.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // Every attribute ibv_query_qp knows (IBV_QP_STATE .. IBV_QP_DEST_QPN).
        let mask = 0x1f_ffff;
        // SAFETY: a live QP; the out-structs are ours.
        check("ibv_query_qp", unsafe {
            (self.ctx.sys.fns.query_qp)(self.qp.as_ptr(), &mut a, mask, &mut init)
        })?;
        qp_attr_from_c(&a, mask).map_err(|e| err("ibv_query_qp", e, "unknown state or MTU"))
    }

    /// `ibv_post_send` through the provider's ops. A UD send finds its AH
    /// by the destination address (one created with `Pd::create_ah` on
    /// this device); inline data is handed over as one SGE, which the
    /// provider copies before returning.
    pub(crate) fn post_send(&self, wr: &SendWr) -> Result<(), Error> {
        if wr.opcode.is_local() {
            return Err(err(
                "ibv_post_send",
                libc::EOPNOTSUPP,
                "memory window binds and local invalidation through the Rust API on a hardware device",
            ));
        }
        let f = self
            .ctx
            .ops()
            .post_send
            .ok_or_else(|| err("ibv_post_send", libc::EOPNOTSUPP, "no post_send"))?;
        let inline = wr
            .inline_data
            .as_ref()
            .filter(|_| wr.flags.contains(SendFlags::INLINE));
        let mut sges = match inline {
            Some(d) => CSges::Few(
                [
                    ibv_sge {
                        addr: d.as_ptr() as u64,
                        length: d.len() as u32,
                        lkey: 0,
                    },
                    ibv_sge::default(),
                    ibv_sge::default(),
                    ibv_sge::default(),
                ],
                1,
            ),
            None => c_sges(&wr.sg_list),
        };
        let sges = sges.as_mut_slice();
        let mut ah_keep = None;
        let wr_union = if let Some(ud) = &wr.ud {
            let ah = self.ctx.ah_for(ud.addr).ok_or_else(|| {
                err(
                    "ibv_post_send",
                    libc::EINVAL,
                    format!("no address handle for {} on this device", ud.addr),
                )
            })?;
            let w = ibv_send_wr_wr {
                ud: ibv_send_wr_ud {
                    ah: ah.ah.as_ptr(),
                    remote_qpn: ud.remote_qpn,
                    remote_qkey: ud.remote_qkey,
                },
            };
            ah_keep = Some(ah);
            w
        } else if wr.opcode.is_atomic() {
            ibv_send_wr_wr {
                atomic: ibv_send_wr_atomic {
                    remote_addr: wr.remote_addr,
                    compare_add: wr.compare_add,
                    swap: wr.swap,
                    rkey: wr.rkey,
                },
            }
        } else {
            ibv_send_wr_wr {
                rdma: ibv_send_wr_rdma {
                    remote_addr: wr.remote_addr,
                    rkey: wr.rkey,
                },
            }
        };
        let imm_data = match wr.opcode {
            crate::SendOpcode::SendWithImm | crate::SendOpcode::RdmaWriteWithImm => {
                wr.imm_data.to_be()
            }
            crate::SendOpcode::SendWithInv => wr.invalidate_rkey,
            _ => 0,
        };
        let mut w = ibv_send_wr {
            wr_id: wr.wr_id,
            next: null_mut(),
            sg_list: sges.as_mut_ptr(),
            num_sge: sges.len() as c_int,
            opcode: wr.opcode as u32,
            send_flags: wr.flags.0,
            imm_data,
            wr: wr_union,
            remote_srqn: 0,
            _bind_mw_or_tso: [0; 6],
        };
        let mut bad = null_mut();
        // SAFETY: a live QP; w, its SGEs, inline data and AH live across
        // the call.
        let rc = unsafe { f(self.qp.as_ptr(), &mut w, &mut bad) };
        drop(ah_keep);
        check("ibv_post_send", rc)
    }

    /// `ibv_post_recv` through the provider's ops.
    pub(crate) fn post_recv(&self, wr: &RecvWr) -> Result<(), Error> {
        let f = self
            .ctx
            .ops()
            .post_recv
            .ok_or_else(|| err("ibv_post_recv", libc::EOPNOTSUPP, "no post_recv"))?;
        let mut sges = c_sges(&wr.sg_list);
        let mut w = recv_wr_c(wr, sges.as_mut_slice());
        let mut bad = null_mut();
        // SAFETY: a live QP; w and its SGEs live across the call.
        check("ibv_post_recv", unsafe {
            f(self.qp.as_ptr(), &mut w, &mut bad)
        })
    }
}

/// The device name as the system library spells it.
pub(crate) fn device_name(sys: &SystemVerbs, dev: *mut c_void) -> Option<String> {
    // SAFETY: dev is a device of a live list; the name is NUL-terminated.
    let name = unsafe { (sys.fns.get_device_name)(dev) };
    // SAFETY: as above.
    (!name.is_null()).then(|| {
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    })
}
