//! roxe's Rust verbs API: devices, protection domains, memory regions,
//! completion queues and channels, queue pairs, shared receive queues and
//! address handles, with the names and semantics of libibverbs.
//!
//! Objects are reference-counted handles: a QP keeps its PD and CQs alive,
//! an MR its PD, and everything its device, so nothing can outlive what it
//! depends on; each frees its resource on drop. Every failing verb returns
//! an [`Error`] naming the verb and carrying the errno libibverbs would.
//!
//! ```no_run
//! use roxe_verbs::*;
//! let dev = devices()?.remove(0).open()?;
//! let pd = dev.alloc_pd()?;
//! let cq = dev.create_cq(16, None)?;
//! let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?;
//! # Ok::<(), Error>(())
//! ```
//!
//! The backend is chosen per device ([`Backend`]). The soft backend is
//! roxe's own transport over UDP. The system's real RDMA devices are listed
//! as [`Backend::Hardware`] (`hw`: the system libibverbs, loaded at run
//! time); opening them is not built yet. `ROXE_BACKEND=soft|hardware|auto`
//! chooses what [`devices`] offers.

use parking_lot::Mutex;
use roxe_provider::driver::{self, Device};
pub use roxe_provider::engine::QpEvent;
use roxe_provider::engine::{CqId, QpCap, QpInitAttr, SrqId};
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

pub use roxe_provider::driver::{CompChannel, DeviceConfig, DeviceStats, FaultSpec, IcrcMode};
pub use roxe_provider::memory::Sge;
pub use roxe_provider::qp_attr::{AddressVector, AttrMask, Mtu, QpAttr, QpState, QpType};
pub use roxe_provider::wr::{
    wc_flags, RecvWr, SendFlags, SendOpcode, SendWr, UdDest, WorkCompletion,
};
pub use roxe_provider::{driver as soft, wire};

#[doc(hidden)]
pub mod abi;
pub mod cm;
pub mod hw;
pub use roxe_provider::{AccessFlags, Errno, VerbsError, WcOpcode, WcStatus};

/// A failed verb.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The verb was refused (the errno libibverbs would give).
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// An operating-system error (opening a device's socket, a channel).
    #[error("{verb}: {source}")]
    Io {
        /// The failing verb.
        verb: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// The environment's configuration is invalid.
    #[error(transparent)]
    Config(#[from] driver::ConfigError),
}

impl Error {
    /// The errno a C caller would see.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Verbs(e) => e.errno.0,
            Error::Io { source, .. } => source
                .raw_os_error()
                // An error with context (driver::NeedsCapNetRaw) carries
                // the OS error as its source.
                .or_else(|| {
                    std::error::Error::source(source)
                        .and_then(|e| e.downcast_ref::<std::io::Error>())
                        .and_then(std::io::Error::raw_os_error)
                })
                .unwrap_or(libc_eio()),
            Error::Config(_) => Errno::EINVAL.0,
        }
    }
}

const fn libc_eio() -> i32 {
    5
}

/// Result of a verb.
pub type Result<T> = std::result::Result<T, Error>;

fn io(verb: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { verb, source }
}

fn verbs(verb: &'static str, errno: Errno, detail: impl Into<String>) -> Error {
    Error::Verbs(VerbsError::new(verb, errno, detail))
}

/// Which implementation serves a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// roxe's own transport over UDP port 4791.
    Soft,
    /// A real RDMA device of the system's libibverbs (mlx5, the kernel's
    /// rxe, ...).
    Hardware,
}

/// A device that can be opened (`struct ibv_device`).
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    name: String,
    config: DeviceConfig,
    /// Set for a device of the system library.
    hardware: Option<hw::HardwareDevice>,
}

impl DeviceInfo {
    /// `roxe0`, `roxe1`, ...
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The backend.
    pub fn backend(&self) -> Backend {
        if self.hardware.is_some() {
            Backend::Hardware
        } else {
            Backend::Soft
        }
    }
    /// The configured address (`None`: picked at open).
    pub fn addr(&self) -> Option<IpAddr> {
        self.config.addr
    }
    /// The node GUID (`ibv_get_device_guid`): derived from the address as
    /// rxe derives it from the MAC (EUI-64 style). A device whose address
    /// is chosen at open: the address it has (open in this process) or
    /// would take if opened now.
    pub fn guid(&self) -> u64 {
        if let Some(h) = &self.hardware {
            return h.guid;
        }
        self.config
            .addr
            .or_else(|| {
                // Open in this process: its address; else the one it
                // would take if opened now.
                open_devices()
                    .lock()
                    .get(&self.name)
                    .and_then(Weak::upgrade)
                    .map(|d| d.addr())
            })
            .or_else(roxe_provider::driver::next_auto_addr)
            .map(guid_of)
            .unwrap_or(0)
    }
    /// `ibv_open_device`: bind the device's socket and start it. Opening the
    /// same device twice in one process shares it. A hardware device:
    /// EOPNOTSUPP (its contexts are not built yet).
    pub fn open(&self) -> Result<Context> {
        if self.hardware.is_some() {
            return Err(verbs(
                "ibv_open_device",
                Errno(95),
                format!(
                    "{} is a hardware device; roxe lists them but cannot open them yet",
                    self.name
                ),
            ));
        }
        let mut open = open_devices().lock();
        // A device already open at the configured address is that device,
        // whatever it was opened as (rdma_cm opens devices by address).
        let at_addr = self.config.addr.and_then(|a| {
            open.values()
                .filter_map(Weak::upgrade)
                .find(|d| d.addr() == a)
        });
        let device = match open
            .get(&self.name)
            .and_then(Weak::upgrade)
            .filter(|d| self.config.addr.is_none_or(|a| d.addr() == a))
            .or(at_addr)
        {
            Some(d) => d,
            None => {
                let d = Arc::new(Device::open(&self.config).map_err(io("ibv_open_device"))?);
                open.insert(self.name.clone(), Arc::downgrade(&d));
                d
            }
        };
        Ok(Context {
            inner: Arc::new(ContextInner {
                name: self.name.clone(),
                device,
            }),
        })
    }
}

/// Every device open in this process, by name.
fn open_devices() -> &'static Mutex<HashMap<String, Weak<Device>>> {
    static OPEN: OnceLock<Mutex<HashMap<String, Weak<Device>>>> = OnceLock::new();
    OPEN.get_or_init(Default::default)
}

/// The device at `addr`: the one open in this process, else the
/// `ROXE_ADDR` device with that address, else a new device there (with the
/// environment's other settings). Fails as `ibv_open_device` does when no
/// socket can be bound there (`EADDRNOTAVAIL`: not an address of this host;
/// `EADDRINUSE`: another process has it).
pub fn open_at(addr: IpAddr) -> Result<Context> {
    if let Some(info) = soft_devices()?.into_iter().find(|d| d.addr() == Some(addr)) {
        return info.open();
    }
    let live = open_devices().lock().iter().find_map(|(name, d)| {
        d.upgrade()
            .filter(|d| d.addr() == addr)
            .map(|_| name.clone())
    });
    let config = DeviceConfig {
        addr: Some(addr),
        ..DeviceConfig::from_env()?
    };
    device_with(live.unwrap_or_else(|| format!("roxe-{addr}")), config).open()
}

/// A GUID from an address: the low 48 bits of its IPv6 (or mapped) form,
/// with 0xFFFE in the middle as EUI-64 does with MACs.
fn guid_of(addr: IpAddr) -> u64 {
    let g = roxe_provider::engine::gid_of(addr);
    u64::from_be_bytes([g[10], g[11], g[12], 0xff, 0xfe, g[13], g[14], g[15]])
}

/// `ibv_get_device_list`: what `ROXE_BACKEND` (default auto) offers, soft
/// devices first ([`soft_devices`]), then the system's real devices
/// ([`hardware_devices`]; none where there is no system library).
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let choice = hw::BackendChoice::from_env()
        .map_err(|e| verbs("ibv_get_device_list", Errno::EINVAL, e))?;
    let mut list = Vec::new();
    if choice != hw::BackendChoice::Hardware {
        list = soft_devices()?;
    }
    if choice != hw::BackendChoice::Soft {
        list.extend(hardware_devices().unwrap_or_default());
    }
    Ok(list)
}

/// roxe's soft devices: one per address in `ROXE_ADDR` (comma-separated),
/// or one that takes the first free loopback address.
pub fn soft_devices() -> Result<Vec<DeviceInfo>> {
    Ok(DeviceConfig::all_from_env()?
        .into_iter()
        .enumerate()
        .map(|(i, config)| DeviceInfo {
            name: format!("roxe{i}"),
            config,
            hardware: None,
        })
        .collect())
}

/// The system's real RDMA devices; Err says in one line why there are
/// none to offer (no system library, or it failed to load).
pub fn hardware_devices() -> std::result::Result<Vec<DeviceInfo>, String> {
    let sys = hw::system().as_ref().map_err(Clone::clone)?;
    Ok(sys
        .devices()
        .into_iter()
        .map(|h| DeviceInfo {
            name: h.name.clone(),
            config: DeviceConfig::default(),
            hardware: Some(h),
        })
        .collect())
}

/// A device named `name` at `addr`, with the environment's other
/// settings (the defaults where the environment does not parse): how the
/// drop-in librdmacm names a device it opened by address.
pub fn device_at(name: impl Into<String>, addr: IpAddr) -> DeviceInfo {
    let config = DeviceConfig {
        addr: Some(addr),
        ..DeviceConfig::from_env().unwrap_or_default()
    };
    device_with(name, config)
}

/// A device described in code rather than by the environment.
pub fn device_with(name: impl Into<String>, config: DeviceConfig) -> DeviceInfo {
    DeviceInfo {
        name: name.into(),
        config,
        hardware: None,
    }
}

struct ContextInner {
    name: String,
    device: Arc<Device>,
}

/// An open device (`struct ibv_context`).
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.inner.name)
            .field("addr", &self.inner.device.addr())
            .finish()
    }
}

/// `struct ibv_device_attr`, the fields programs read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Firmware version string's numbers.
    pub fw_ver: u64,
    /// Node GUID.
    pub node_guid: u64,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Supported page sizes.
    pub page_size_cap: u64,
    /// Vendor id (0: soft).
    pub vendor_id: u32,
    /// Largest QP count.
    pub max_qp: u32,
    /// Largest WR count per queue.
    pub max_qp_wr: u32,
    /// Largest SGE count per WR.
    pub max_sge: u32,
    /// Largest CQ count.
    pub max_cq: u32,
    /// Largest CQ depth.
    pub max_cqe: u32,
    /// Largest MR count.
    pub max_mr: u32,
    /// Largest PD count.
    pub max_pd: u32,
    /// Outstanding READ/atomics a QP accepts.
    pub max_qp_rd_atom: u32,
    /// Outstanding READ/atomics a QP issues.
    pub max_qp_init_rd_atom: u32,
    /// Largest SRQ count.
    pub max_srq: u32,
    /// Largest SRQ depth.
    pub max_srq_wr: u32,
    /// Largest SGE count per SRQ WR.
    pub max_srq_sge: u32,
    /// Largest inline data.
    pub max_inline_data: u32,
    /// Partition keys.
    pub max_pkeys: u16,
    /// Physical ports.
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr`, the fields programs read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// Always ACTIVE (4).
    pub state: u8,
    /// Largest MTU.
    pub max_mtu: Mtu,
    /// Active MTU.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// LID (loopback devices only; 0 otherwise).
    pub lid: u16,
    /// `IBV_LINK_LAYER_ETHERNET` (2).
    pub link_layer: u8,
    /// Largest message.
    pub max_msg_sz: u32,
}

impl Context {
    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// The soft device underneath (counters, address).
    pub fn device(&self) -> &Device {
        &self.inner.device
    }
    /// The device's address.
    pub fn addr(&self) -> IpAddr {
        self.inner.device.addr()
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        let e = self.inner.device.engine();
        let c = e.config();
        DeviceAttr {
            fw_ver: 0,
            node_guid: guid_of(self.addr()),
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            vendor_id: 0xffffff,
            max_qp: 0x10000,
            max_qp_wr: c.max_qp_wr,
            max_sge: c.max_sge,
            max_cq: 0x10000,
            max_cqe: c.max_cqe,
            max_mr: roxe_provider::memory::MAX_REGIONS,
            max_pd: 0x10000,
            max_qp_rd_atom: u32::from(c.qp_limits.max_qp_rd_atom),
            max_qp_init_rd_atom: u32::from(c.qp_limits.max_qp_init_rd_atom),
            max_srq: 0x10000,
            max_srq_wr: c.max_qp_wr,
            max_srq_sge: c.max_sge,
            max_inline_data: c.max_inline,
            max_pkeys: c.qp_limits.pkey_table_len,
            phys_port_cnt: c.qp_limits.port_count,
        }
    }

    /// `ibv_query_port` (port 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port != 1 {
            return Err(verbs(
                "ibv_query_port",
                Errno::EINVAL,
                format!("no port {port}"),
            ));
        }
        Ok(PortAttr {
            state: 4,
            max_mtu: Mtu::Mtu4096,
            // From the link the address is on, as rxe's from its netdev.
            active_mtu: self.inner.device.engine().config().active_mtu,
            gid_tbl_len: 1,
            pkey_tbl_len: 1,
            lid: self.inner.device.lid(),
            link_layer: 2,
            max_msg_sz: 0x8000_0000,
        })
    }

    /// `ibv_query_gid`: index 0 is the RoCEv2 GID of the device's address.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
        if port != 1 || index != 0 {
            return Err(verbs(
                "ibv_query_gid",
                Errno::EINVAL,
                format!("no GID {index} on port {port}"),
            ));
        }
        Ok(self.inner.device.gid())
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let id = self.inner.device.engine().alloc_pd();
        Ok(Pd {
            inner: Arc::new(PdInner {
                ctx: self.clone(),
                id,
            }),
        })
    }

    /// The device's asynchronous QP events from now on (what
    /// `ibv_get_async_event` reads): SQ drained, last WQE reached.
    pub fn async_events(&self) -> Result<AsyncEvents> {
        let (rx, tx) = UnixDatagram::pair().map_err(io("ibv_get_async_event"))?;
        tx.set_nonblocking(true)
            .map_err(io("ibv_get_async_event"))?;
        let sink: Arc<soft::EventSink> = Arc::new(move |ev: QpEvent| {
            let mut b = [0u8; 8];
            b[..4].copy_from_slice(&ev.qpn.to_le_bytes());
            b[4..].copy_from_slice(&ev.event_type.to_le_bytes());
            // Non-blocking: a reader that never reads loses events rather
            // than stalling the device.
            let _ = tx.send(&b);
        });
        self.inner.device.subscribe_events(&sink);
        Ok(AsyncEvents { rx, _sink: sink })
    }

    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        CompChannel::new().map_err(io("ibv_create_comp_channel"))
    }

    /// `ibv_create_cq` with `depth` entries, its events going to `channel`.
    pub fn create_cq(&self, depth: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        let (id, waiting) = {
            let mut e = self.inner.device.engine();
            let id = e.create_cq(depth)?;
            let waiting = e
                .cq_mut(id)
                .map(|c| c.waiting_counter())
                .ok_or_else(|| verbs("ibv_create_cq", Errno::EINVAL, "CQ vanished"))?;
            (id, waiting)
        };
        if let Some(ch) = channel {
            self.inner.device.attach_channel(id, ch);
        }
        Ok(Cq {
            inner: Arc::new(CqInner {
                ctx: self.clone(),
                id,
                channel: channel.cloned(),
                waiting,
                empty_polls: AtomicU32::new(0),
            }),
        })
    }
}

/// A context's asynchronous event queue ([`Context::async_events`]). Its
/// fd (`AsFd`) becomes readable when an event is pending, for poll, epoll
/// or tokio.
pub struct AsyncEvents {
    rx: UnixDatagram,
    _sink: Arc<soft::EventSink>,
}

impl AsyncEvents {
    /// Wait for the next event (`ibv_get_async_event`); with the queue
    /// non-blocking, `WouldBlock` when none is pending.
    pub fn get(&self) -> std::io::Result<QpEvent> {
        let mut b = [0u8; 8];
        loop {
            match self.rx.recv(&mut b) {
                Ok(8) => {
                    let (q, t) = b.split_at(4);
                    let word = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                    return Ok(QpEvent {
                        qpn: word(q),
                        event_type: word(t),
                    });
                }
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Wait at most `timeout` for the next event.
    pub fn get_timeout(&self, timeout: Duration) -> std::io::Result<Option<QpEvent>> {
        self.rx
            .set_read_timeout(Some(timeout.max(Duration::from_micros(1))))?;
        let r = match self.get() {
            Ok(e) => Ok(Some(e)),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        };
        self.rx.set_read_timeout(None)?;
        r
    }

    /// Make [`get`](Self::get) return `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> std::io::Result<()> {
        self.rx.set_nonblocking(nonblocking)
    }
}

impl std::os::fd::AsFd for AsyncEvents {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.rx.as_fd()
    }
}

struct PdInner {
    ctx: Context,
    id: roxe_provider::PdId,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        let _ = self.ctx.inner.device.engine().dealloc_pd(self.id);
    }
}

/// A protection domain (`struct ibv_pd`).
#[derive(Clone)]
pub struct Pd {
    inner: Arc<PdInner>,
}

impl Pd {
    fn device(&self) -> &Device {
        &self.inner.ctx.inner.device
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// `ibv_reg_mr` of a zeroed buffer of `len` bytes that roxe owns; read
    /// and write it with [`Mr::read`] / [`Mr::write`].
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        let info =
            self.device()
                .engine()
                .memory_mut()
                .register_owned(self.inner.id, len, access)?;
        Ok(Mr {
            pd: self.clone(),
            info,
            len,
        })
    }

    /// `ibv_reg_mr` of memory the caller owns, named `iova` on the wire.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay valid (allocated, not moved) until the
    /// returned [`Mr`] is dropped; remote peers holding the rkey and the
    /// device's progress thread may read or write it at any time while it
    /// is registered, so the caller must not hold Rust references into it
    /// during that time and must only look at data a completion has
    /// announced (the contract of `MemoryTable::register_raw`).
    pub unsafe fn reg_mr_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        // SAFETY: the caller upholds register_raw's contract (see above).
        let info = unsafe {
            self.device().engine().memory_mut().register_raw(
                self.inner.id,
                ptr,
                len,
                iova,
                access,
            )?
        };
        Ok(Mr {
            pd: self.clone(),
            info,
            len,
        })
    }

    /// `ibv_create_qp`.
    pub fn create_qp(&self, init: &QpInit<'_>) -> Result<Qp> {
        let attr = QpInitAttr {
            qp_type: init.qp_type,
            pd: self.inner.id,
            send_cq: init.send_cq.inner.id,
            recv_cq: init.recv_cq.inner.id,
            srq: init.srq.map(|s| s.inner.id),
            cap: init.cap,
            sq_sig_all: init.sq_sig_all,
        };
        let qpn = self.device().engine().create_qp(attr)?;
        Ok(Qp {
            inner: Arc::new(QpInner {
                pd: self.clone(),
                qpn,
                qp_type: init.qp_type,
                _send_cq: init.send_cq.clone(),
                _recv_cq: init.recv_cq.clone(),
                _srq: init.srq.cloned(),
            }),
        })
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let id = self
            .device()
            .engine()
            .create_srq(self.inner.id, max_wr, max_sge)?;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: self.clone(),
                id,
            }),
        })
    }

    /// `ibv_create_ah`: where UD sends go.
    pub fn create_ah(&self, av: &AddressVector) -> Result<Ah> {
        let resolved = self.device().resolve_av(av).ok_or_else(|| {
            verbs(
                "ibv_create_ah",
                Errno::EINVAL,
                "RoCE needs a GRH (is_global = 1), except between loopback devices by LID",
            )
        })?;
        Ok(Ah {
            _pd: self.clone(),
            addr: roxe_provider::engine::addr_of_gid(resolved.dgid),
        })
    }
}

/// A memory region (`struct ibv_mr`).
pub struct Mr {
    pd: Pd,
    info: roxe_provider::memory::MrInfo,
    len: usize,
}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.info.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.info.rkey
    }
    /// The address work requests and peers use for byte 0.
    pub fn addr(&self) -> u64 {
        self.info.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// An SGE for `[offset, offset + length)` of this region.
    pub fn sge(&self, offset: usize, length: u32) -> Sge {
        Sge {
            addr: self.info.addr + offset as u64,
            length,
            lkey: self.info.lkey,
        }
    }
    /// Copy bytes out of a region [`Pd::reg_mr`] allocated.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.pd
            .device()
            .engine()
            .memory()
            .owned_read(self.info.lkey, offset, out)
            .map_err(|e| verbs("mr.read", Errno::EINVAL, format!("{e:?}")))
    }
    /// Copy bytes into a region [`Pd::reg_mr`] allocated.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.pd
            .device()
            .engine()
            .memory_mut()
            .owned_write(self.info.lkey, offset, data)
            .map_err(|e| verbs("mr.write", Errno::EINVAL, format!("{e:?}")))
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let _ = self
            .pd
            .device()
            .engine()
            .memory_mut()
            .deregister(self.info.lkey);
    }
}

struct CqInner {
    ctx: Context,
    id: CqId,
    channel: Option<CompChannel>,
    /// Completions waiting, readable without the engine lock.
    waiting: Arc<AtomicUsize>,
    /// Consecutive polls that found nothing.
    empty_polls: AtomicU32,
}

/// After this many empty polls in a row, `Cq::poll` yields the CPU once: a
/// program spinning on `poll_cq` must leave the progress thread (which
/// delivers its completions) room to run on a small machine.
const EMPTY_POLLS_BEFORE_YIELD: u32 = 64;

impl Drop for CqInner {
    fn drop(&mut self) {
        let d = &self.ctx.inner.device;
        if self.channel.is_some() {
            d.detach_channel(self.id);
        }
        let _ = d.engine().destroy_cq(self.id);
    }
}

/// A completion queue (`struct ibv_cq`).
#[derive(Clone)]
pub struct Cq {
    inner: Arc<CqInner>,
}

impl Cq {
    fn device(&self) -> &Device {
        &self.inner.ctx.inner.device
    }
    /// The engine's id of this CQ (what channel events carry).
    pub fn id(&self) -> CqId {
        self.inner.id
    }
    /// `ibv_poll_cq`: fill `out`, return how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        if self.inner.waiting.load(Ordering::Acquire) == 0 {
            // Nothing waiting: do not take the engine lock.
            let n = self.inner.empty_polls.fetch_add(1, Ordering::Relaxed);
            if n % EMPTY_POLLS_BEFORE_YIELD == EMPTY_POLLS_BEFORE_YIELD - 1 {
                std::thread::yield_now();
            }
            return Ok(0);
        }
        self.inner.empty_polls.store(0, Ordering::Relaxed);
        Ok(self.device().engine().poll_cq(self.inner.id, out)?)
    }
    /// `ibv_req_notify_cq`: the next completion (or the next solicited one)
    /// raises one event on the channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let mut e = self.device().engine();
        let cq = e
            .cq_mut(self.inner.id)
            .ok_or_else(|| verbs("ibv_req_notify_cq", Errno::EINVAL, "CQ destroyed"))?;
        cq.request_notify(solicited_only);
        Ok(())
    }
    /// Poll until `n` completions arrived or `timeout` passed (spinning,
    /// then yielding): a convenience for examples and tests.
    pub fn poll_wait(&self, n: usize, timeout: Duration) -> Result<Vec<WorkCompletion>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut out = Vec::with_capacity(n);
        let mut buf = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 32];
        let mut spins = 0u32;
        while out.len() < n {
            let k = self.poll(&mut buf[..(n - out.len()).min(32)])?;
            out.extend_from_slice(&buf[..k]);
            if k == 0 {
                if std::time::Instant::now() >= deadline {
                    return Err(verbs(
                        "ibv_poll_cq",
                        Errno::ETIMEDOUT,
                        format!("{} of {n} completions after {timeout:?}", out.len()),
                    ));
                }
                spins += 1;
                if spins > 1000 {
                    std::thread::yield_now();
                }
            }
        }
        Ok(out)
    }
}

struct SrqInner {
    pd: Pd,
    id: SrqId,
}

/// A shared receive queue (`struct ibv_srq`).
#[derive(Clone)]
pub struct Srq {
    inner: Arc<SrqInner>,
}

impl Srq {
    /// `ibv_post_srq_recv`.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        Ok(self
            .inner
            .pd
            .device()
            .engine()
            .post_srq_recv(self.inner.id, wr)?)
    }
}

/// An address handle (`struct ibv_ah`): a resolved UD destination.
#[derive(Clone)]
pub struct Ah {
    _pd: Pd,
    addr: IpAddr,
}

impl Ah {
    /// The destination device's address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }
    /// The `wr.ud` of a send to QP `remote_qpn` with `remote_qkey`.
    pub fn dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest {
            addr: self.addr,
            remote_qpn,
            remote_qkey,
        }
    }
}

/// `struct ibv_qp_init_attr`.
pub struct QpInit<'a> {
    /// Transport.
    pub qp_type: QpType,
    /// Send completions.
    pub send_cq: &'a Cq,
    /// Receive completions.
    pub recv_cq: &'a Cq,
    /// Shared receive queue.
    pub srq: Option<&'a Srq>,
    /// Queue sizes.
    pub cap: QpCap,
    /// Complete every send WR.
    pub sq_sig_all: bool,
}

impl<'a> QpInit<'a> {
    /// Defaults: 128-deep queues, 4 SGEs, 64 inline bytes, sq_sig_all off.
    pub fn new(qp_type: QpType, send_cq: &'a Cq, recv_cq: &'a Cq) -> Self {
        QpInit {
            qp_type,
            send_cq,
            recv_cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 128,
                max_recv_wr: 128,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        }
    }
}

struct QpInner {
    pd: Pd,
    qpn: u32,
    qp_type: QpType,
    _send_cq: Cq,
    _recv_cq: Cq,
    _srq: Option<Srq>,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        let _ = self.pd.device().engine().destroy_qp(self.qpn);
    }
}

/// A queue pair (`struct ibv_qp`).
#[derive(Clone)]
pub struct Qp {
    inner: Arc<QpInner>,
}

impl Qp {
    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.inner.qpn
    }
    /// The transport.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }
    /// `ibv_modify_qp`. An LID-only address vector (`is_global = 0`) is
    /// routed to the loopback device with that LID.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        let dev = self.inner.pd.device();
        let mut attr = *attr;
        if mask.contains(AttrMask::AV) {
            if let Some(av) = dev.resolve_av(&attr.av) {
                attr.av = av;
            }
        }
        Ok(dev.engine().modify_qp(self.inner.qpn, &attr, mask)?)
    }
    /// `ibv_query_qp`: the attributes and the current state.
    pub fn query(&self) -> Result<QpAttr> {
        Ok(self.inner.pd.device().engine().query_qp(self.inner.qpn)?.0)
    }
    /// `ibv_post_send`.
    pub fn post_send(&self, wr: SendWr) -> Result<()> {
        Ok(self
            .inner
            .pd
            .device()
            .engine()
            .post_send(self.inner.qpn, wr)?)
    }
    /// `ibv_post_recv`.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        Ok(self
            .inner
            .pd
            .device()
            .engine()
            .post_recv(self.inner.qpn, wr)?)
    }
}

/// What two sides exchange out of band to connect an RC/UC QP pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// LID (loopback devices).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// GID.
    pub gid: [u8; 16],
}

impl Qp {
    /// This side's endpoint (GID and LID of its device), with `psn`.
    pub fn endpoint(&self, psn: u32) -> Endpoint {
        let d = self.inner.pd.device();
        Endpoint {
            lid: d.lid(),
            qpn: self.inner.qpn,
            psn,
            gid: d.gid(),
        }
    }

    /// RESET → INIT → RTR → RTS towards `remote` with the usual attributes
    /// (the modify masks `ibv_rc_pingpong` uses): `access` for the remote
    /// side, path MTU `mtu`, `timeout`/`retry_cnt`/`rnr_retry` as given.
    pub fn connect(
        &self,
        local_psn: u32,
        remote: &Endpoint,
        mtu: Mtu,
        access: AccessFlags,
        timeout: u8,
    ) -> Result<()> {
        let rc = self.inner.qp_type == QpType::Rc;
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: access,
            ..QpAttr::default()
        };
        self.modify(
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        )?;
        a.qp_state = QpState::Rtr;
        a.path_mtu = mtu;
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.av = AddressVector {
            dgid: remote.gid,
            is_global: true,
            hop_limit: 64,
            dlid: remote.lid,
            port_num: 1,
            ..AddressVector::default()
        };
        let mut mask = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN;
        if rc {
            a.max_dest_rd_atomic = 16;
            a.min_rnr_timer = 12;
            mask = mask | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        }
        self.modify(&a, mask)?;
        a.qp_state = QpState::Rts;
        a.sq_psn = local_psn;
        let mut mask = AttrMask::STATE | AttrMask::SQ_PSN;
        if rc {
            a.timeout = timeout;
            a.retry_cnt = 7;
            a.rnr_retry = 7;
            a.max_rd_atomic = 16;
            mask = mask
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC;
        }
        self.modify(&a, mask)
    }

    /// RESET → INIT → RTR → RTS for a UD QP with `qkey`.
    pub fn ready_ud(&self, qkey: u32, sq_psn: u32) -> Result<()> {
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        self.modify(
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        )?;
        a.qp_state = QpState::Rtr;
        self.modify(&a, AttrMask::STATE)?;
        a.qp_state = QpState::Rts;
        a.sq_psn = sq_psn;
        self.modify(&a, AttrMask::STATE | AttrMask::SQ_PSN)
    }
}
