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
pub use roxe_provider::engine::QpCap;
pub use roxe_provider::engine::QpEvent;
use roxe_provider::engine::{QpInitAttr, SrqId, XrcdId};
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

pub use roxe_provider::driver::{DeviceConfig, DeviceStats, FaultSpec, IcrcMode, PacingConfig};
pub use roxe_provider::engine::CqId;
pub use roxe_provider::engine::{tmh_op, SrqOp, SrqOpKind, Tmh, RVH_LEN, TMH_LEN};
pub use roxe_provider::memory::{MwBind, MwType, Sge, MAX_DM_SIZE};
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
    /// `ibv_open_device`. A soft device: bind its socket and start it
    /// (opening the same device twice in one process shares it). A
    /// hardware device: the system library's `ibv_open_device`.
    pub fn open(&self) -> Result<Context> {
        if self.hardware.is_some() {
            let sys = hw::system()
                .as_ref()
                .map_err(|e| verbs("ibv_open_device", Errno(19), e.clone()))?;
            let h = Arc::new(hw::HwContext::open(sys, &self.name)?);
            tracing::debug!(device = %self.name, "hardware device opened through the system libibverbs");
            return Ok(Context {
                inner: Arc::new(ContextInner {
                    name: self.name.clone(),
                    imp: ContextImp::Hw(h),
                }),
            });
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
                imp: ContextImp::Soft(device),
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
    let listed = soft_devices()?.len();
    let (live, name) = {
        let open = open_devices().lock();
        let live = open.iter().find_map(|(name, d)| {
            d.upgrade()
                .filter(|d| d.addr() == addr)
                .map(|_| name.clone())
        });
        // Named as the listed ones are, after them: roxe<N>, a name a
        // sysfs entry and a shell word can hold (not the address).
        let free = (listed..)
            .map(|n| format!("roxe{n}"))
            .find(|n| open.get(n).is_none_or(|d| d.upgrade().is_none()))
            .unwrap_or_default();
        (live, free)
    };
    let config = DeviceConfig {
        addr: Some(addr),
        ..DeviceConfig::from_env()?
    };
    device_with(live.unwrap_or(name), config).open()
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
    imp: ContextImp,
}

/// What serves a context: roxe's engine or the system library.
enum ContextImp {
    Soft(Arc<Device>),
    Hw(Arc<hw::HwContext>),
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
            .field("backend", &self.backend())
            .field("addr", &self.addr())
            .finish()
    }
}

/// `struct ibv_device_attr`, the fields programs read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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

/// `struct ibv_tm_caps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TmCaps {
    /// Largest rendezvous message (TMH, RVH and any user header).
    pub max_rndv_hdr_size: u32,
    /// Largest tag list.
    pub max_num_tags: u32,
    /// Tag-list operations outstanding at once.
    pub max_ops: u32,
    /// SGEs per tagged buffer.
    pub max_sge: u32,
    /// `IBV_TM_CAP_RC`: tag matching on RC QPs.
    pub rc: bool,
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
    /// A soft device's counters (`None` on hardware: see the device's
    /// `hw_counters` in sysfs).
    pub fn stats(&self) -> Option<DeviceStats> {
        self.soft_device().map(Device::stats)
    }
    /// The backend serving this context.
    pub fn backend(&self) -> Backend {
        match self.inner.imp {
            ContextImp::Soft(_) => Backend::Soft,
            ContextImp::Hw(_) => Backend::Hardware,
        }
    }
    /// The soft device underneath (counters, address, CM); `None` on the
    /// hardware backend.
    pub fn soft_device(&self) -> Option<&Device> {
        match &self.inner.imp {
            ContextImp::Soft(d) => Some(d),
            ContextImp::Hw(_) => None,
        }
    }
    /// The soft device, or EOPNOTSUPP naming `verb` on hardware.
    pub(crate) fn soft(&self, verb: &'static str) -> Result<&Device> {
        self.soft_arc(verb).map(|d| &**d)
    }
    /// As [`Context::soft`], the shared handle.
    pub(crate) fn soft_arc(&self, verb: &'static str) -> Result<&Arc<Device>> {
        match &self.inner.imp {
            ContextImp::Soft(d) => Ok(d),
            ContextImp::Hw(_) => Err(Self::not_soft(self.name(), verb)),
        }
    }
    fn not_soft(name: &str, verb: &'static str) -> Error {
        {
            verbs(
                verb,
                Errno(95),
                format!("{name} is a hardware device; {verb} runs on soft devices"),
            )
        }
    }
    /// The device's address: a soft device's own; on hardware, the
    /// address in the default GID ([`Context::default_gid_index`]).
    pub fn addr(&self) -> IpAddr {
        match &self.inner.imp {
            ContextImp::Soft(d) => d.addr(),
            ContextImp::Hw(h) => h
                .query_gid(1, u32::from(h.gid_index()))
                .map(roxe_provider::engine::addr_of_gid)
                .unwrap_or(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)),
        }
    }
    /// The GID index [`Qp::endpoint`] and [`Qp::connect`] use: 0 on a
    /// soft device; on hardware, the first RoCEv2 GID holding an IPv4
    /// address (as rdma_cm picks for IPv4), else the first RoCEv2 GID.
    pub fn default_gid_index(&self) -> u8 {
        match &self.inner.imp {
            ContextImp::Soft(_) => 0,
            ContextImp::Hw(h) => h.gid_index(),
        }
    }
    /// Choose another GID index for [`Qp::endpoint`] and [`Qp::connect`]
    /// (`-g` of the pingpong programs); EINVAL where the port has no such
    /// GID.
    pub fn set_default_gid_index(&self, index: u8) -> Result<()> {
        let gid = self.query_gid(1, u32::from(index))?;
        match &self.inner.imp {
            ContextImp::Soft(_) => Ok(()),
            ContextImp::Hw(h) if gid != [0; 16] => {
                h.set_gid_index(index);
                Ok(())
            }
            ContextImp::Hw(_) => Err(verbs(
                "ibv_query_gid",
                Errno::EINVAL,
                format!("GID index {index} is empty"),
            )),
        }
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        let d = match &self.inner.imp {
            ContextImp::Soft(d) => d,
            ContextImp::Hw(h) => return h.attr,
        };
        let e = d.engine();
        let c = e.config();
        DeviceAttr {
            fw_ver: 0,
            node_guid: guid_of(d.addr()),
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

    /// Tag matching's limits (`ibv_device_attr_ex.tm_caps`): what
    /// [`Pd::create_tm_srq`] accepts. All zero on a hardware device (tag
    /// matching through the Rust API is soft-only).
    pub fn tm_caps(&self) -> TmCaps {
        match &self.inner.imp {
            ContextImp::Soft(d) => {
                let e = d.engine();
                let c = e.config();
                TmCaps {
                    max_rndv_hdr_size: roxe_provider::engine::MAX_RNDV_HDR,
                    max_num_tags: c.max_tm_tags,
                    // Operations execute as they are posted.
                    max_ops: c.max_qp_wr,
                    max_sge: c.max_sge,
                    rc: true,
                }
            }
            ContextImp::Hw(_) => TmCaps::default(),
        }
    }

    /// `ibv_query_port` (port 1 on a soft device).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let d = match &self.inner.imp {
            ContextImp::Soft(d) => d,
            ContextImp::Hw(h) => return h.port_attr(port),
        };
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
            active_mtu: d.engine().config().active_mtu,
            gid_tbl_len: SOFT_GID_TABLE_LEN,
            pkey_tbl_len: 1,
            lid: d.lid(),
            link_layer: 2,
            max_msg_sz: 0x8000_0000,
        })
    }

    /// `ibv_query_gid`: on a soft device, indexes 0 and 1 hold the RoCEv2
    /// GID of the device's address (1 is where rxe lists the IPv4 GID, so
    /// programs written for rxe find it there); the rest of its table (as
    /// rxe's, room for more addresses) is empty: ENODATA.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
        let d = match &self.inner.imp {
            ContextImp::Soft(d) => d,
            ContextImp::Hw(h) => return h.query_gid(port, index),
        };
        match (port, index) {
            (1, 0 | 1) => Ok(d.gid()),
            (1, i) if i < SOFT_GID_TABLE_LEN => Err(verbs(
                "ibv_query_gid",
                Errno::ENODATA,
                format!("GID index {i} is empty"),
            )),
            _ => Err(verbs(
                "ibv_query_gid",
                Errno::EINVAL,
                format!("no GID {index} on port {port}"),
            )),
        }
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let imp = match &self.inner.imp {
            ContextImp::Soft(d) => PdImp::Soft(d.clone(), d.engine().alloc_pd()),
            ContextImp::Hw(h) => PdImp::Hw(hw::HwPd::alloc(h)?),
        };
        Ok(Pd {
            inner: Arc::new(PdInner {
                imp,
                ctx: self.clone(),
            }),
        })
    }

    /// The device's asynchronous QP events from now on (what
    /// `ibv_get_async_event` reads): SQ drained, last WQE reached. On
    /// hardware, the context's own event queue (all events, from its
    /// opening).
    pub fn async_events(&self) -> Result<AsyncEvents> {
        let d = match &self.inner.imp {
            ContextImp::Soft(d) => d,
            ContextImp::Hw(h) => {
                return Ok(AsyncEvents {
                    imp: AsyncImp::Hw(h.clone()),
                })
            }
        };
        let (rx, tx) = UnixDatagram::pair().map_err(io("ibv_get_async_event"))?;
        tx.set_nonblocking(true)
            .map_err(io("ibv_get_async_event"))?;
        let sink: Arc<soft::EventSink> = Arc::new(move |ev: QpEvent| {
            tracing::debug!(
                qpn = format_args!("{:#x}", ev.qpn),
                event_type = ev.event_type,
                "asynchronous event"
            );
            let mut b = [0u8; 8];
            b[..4].copy_from_slice(&ev.qpn.to_le_bytes());
            b[4..].copy_from_slice(&ev.event_type.to_le_bytes());
            // Non-blocking: a reader that never reads loses events rather
            // than stalling the device.
            let _ = tx.send(&b);
        });
        d.subscribe_events(&sink);
        Ok(AsyncEvents {
            imp: AsyncImp::Soft { rx, _sink: sink },
        })
    }

    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        Ok(CompChannel {
            imp: match &self.inner.imp {
                ContextImp::Soft(_) => ChannelImp::Soft(
                    soft::CompChannel::new().map_err(io("ibv_create_comp_channel"))?,
                ),
                ContextImp::Hw(h) => ChannelImp::Hw(Arc::new(hw::HwChannel::create(h)?)),
            },
        })
    }

    /// `ibv_create_cq` with `depth` entries, its events going to `channel`
    /// (a channel of this context).
    pub fn create_cq(&self, depth: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        let foreign = || {
            verbs(
                "ibv_create_cq",
                Errno::EINVAL,
                "a channel of another backend",
            )
        };
        let imp = match &self.inner.imp {
            ContextImp::Hw(h) => {
                let ch = match channel.map(|c| &c.imp) {
                    None => None,
                    Some(ChannelImp::Hw(c)) => Some(c),
                    Some(ChannelImp::Soft(_)) => return Err(foreign()),
                };
                CqImp::Hw(hw::HwCq::create(h, depth, ch)?)
            }
            ContextImp::Soft(d) => {
                let ch = match channel.map(|c| &c.imp) {
                    None => None,
                    Some(ChannelImp::Soft(c)) => Some(c),
                    Some(ChannelImp::Hw(_)) => return Err(foreign()),
                };
                let (id, waiting) = {
                    let mut e = d.engine();
                    let id = e.create_cq(depth)?;
                    let waiting = e
                        .cq_mut(id)
                        .map(|c| c.waiting_counter())
                        .ok_or_else(|| verbs("ibv_create_cq", Errno::EINVAL, "CQ vanished"))?;
                    (id, waiting)
                };
                if let Some(ch) = ch {
                    d.attach_channel(id, ch);
                }
                CqImp::Soft {
                    dev: d.clone(),
                    id,
                    waiting,
                    empty_polls: AtomicU32::new(0),
                }
            }
        };
        Ok(Cq {
            inner: Arc::new(CqInner {
                imp,
                _ctx: self.clone(),
                channel: channel.cloned(),
            }),
        })
    }
}

/// Entries in a soft device's GID table (`gid_tbl_len`): indexes 0 and 1
/// hold its address's GID, the others are empty, as unused entries of
/// rxe's.
pub const SOFT_GID_TABLE_LEN: u32 = 16;

/// A completion channel (`struct ibv_comp_channel`): its fd (`AsFd`)
/// becomes readable when a CQ attached to it has an event.
#[derive(Clone)]
pub struct CompChannel {
    imp: ChannelImp,
}

#[derive(Clone)]
enum ChannelImp {
    Soft(soft::CompChannel),
    Hw(Arc<hw::HwChannel>),
}

impl std::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

impl CompChannel {
    /// Wait for the next event (`ibv_get_cq_event`, acknowledged): the
    /// id of the CQ that raised it ([`Cq::id`]).
    pub fn get_event(&self) -> std::io::Result<CqId> {
        match &self.imp {
            ChannelImp::Soft(c) => c.get_event(),
            ChannelImp::Hw(h) => h.get_event().map(CqId),
        }
    }
    /// Wait at most `timeout` for an event.
    pub fn get_event_timeout(&self, timeout: Duration) -> std::io::Result<Option<CqId>> {
        match &self.imp {
            ChannelImp::Soft(c) => c.get_event_timeout(timeout),
            ChannelImp::Hw(h) => {
                if !poll_readable(h.fd(), timeout)? {
                    return Ok(None);
                }
                h.get_event().map(|id| Some(CqId(id)))
            }
        }
    }
    /// Make [`get_event`](Self::get_event) fail with `WouldBlock` instead
    /// of waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> std::io::Result<()> {
        match &self.imp {
            ChannelImp::Soft(c) => c.set_nonblocking(nonblocking),
            ChannelImp::Hw(h) => set_fd_nonblocking(h.fd(), nonblocking),
        }
    }
}

impl std::os::fd::AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match &self.imp {
            ChannelImp::Soft(c) => c.as_raw_fd(),
            ChannelImp::Hw(h) => h.fd(),
        }
    }
}

impl std::os::fd::AsFd for CompChannel {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the fd belongs to the channel this borrows, open until
        // the channel is dropped.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

/// Whether `fd` became readable within `timeout`.
fn poll_readable(fd: std::os::fd::RawFd, timeout: Duration) -> std::io::Result<bool> {
    // SAFETY: fd is open for the duration of the call (its owner is
    // borrowed by the caller).
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    Ok(rustix::event::poll(&mut fds, Some(&ts))? > 0)
}

fn set_fd_nonblocking(fd: std::os::fd::RawFd, nonblocking: bool) -> std::io::Result<()> {
    // SAFETY: as in poll_readable.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mut fl = rustix::fs::fcntl_getfl(fd)?;
    fl.set(rustix::fs::OFlags::NONBLOCK, nonblocking);
    Ok(rustix::fs::fcntl_setfl(fd, fl)?)
}

/// A context's asynchronous event queue ([`Context::async_events`]). Its
/// fd (`AsFd`) becomes readable when an event is pending, for poll, epoll
/// or tokio.
pub struct AsyncEvents {
    imp: AsyncImp,
}

enum AsyncImp {
    Soft {
        rx: UnixDatagram,
        _sink: Arc<soft::EventSink>,
    },
    Hw(Arc<hw::HwContext>),
}

impl AsyncEvents {
    /// Wait for the next event (`ibv_get_async_event`); with the queue
    /// non-blocking, `WouldBlock` when none is pending.
    pub fn get(&self) -> std::io::Result<QpEvent> {
        let rx = match &self.imp {
            AsyncImp::Soft { rx, .. } => rx,
            AsyncImp::Hw(h) => return h.get_async_event(),
        };
        let mut b = [0u8; 8];
        loop {
            match rx.recv(&mut b) {
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
        if !poll_readable(self.as_fd().as_raw_fd(), timeout)? {
            return Ok(None);
        }
        match self.get() {
            Ok(e) => Ok(Some(e)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Make [`get`](Self::get) return `WouldBlock` instead of waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> std::io::Result<()> {
        match &self.imp {
            AsyncImp::Soft { rx, .. } => rx.set_nonblocking(nonblocking),
            AsyncImp::Hw(h) => set_fd_nonblocking(h.async_fd(), nonblocking),
        }
    }
}

impl std::os::fd::AsFd for AsyncEvents {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match &self.imp {
            AsyncImp::Soft { rx, .. } => rx.as_fd(),
            // SAFETY: the context's async fd, open while the context (held
            // here) is.
            AsyncImp::Hw(h) => unsafe { std::os::fd::BorrowedFd::borrow_raw(h.async_fd()) },
        }
    }
}

struct PdInner {
    /// Dropped first (fields drop in order): a hardware PD before its
    /// context.
    imp: PdImp,
    ctx: Context,
}

/// Each soft half carries its device, so a soft object can never be
/// paired with a hardware context.
enum PdImp {
    Soft(Arc<Device>, roxe_provider::PdId),
    Hw(hw::HwPd),
}

impl Drop for PdInner {
    fn drop(&mut self) {
        if let PdImp::Soft(d, id) = &self.imp {
            let _ = d.engine().dealloc_pd(*id);
        }
    }
}

/// A protection domain (`struct ibv_pd`).
#[derive(Clone)]
pub struct Pd {
    inner: Arc<PdInner>,
}

/// One object's soft or hardware half, by its PD's backend.
enum Half<'a, S, H> {
    Soft(&'a Arc<Device>, S),
    Hw(H),
}

impl Pd {
    fn half(&self) -> Half<'_, roxe_provider::PdId, &hw::HwPd> {
        match &self.inner.imp {
            PdImp::Soft(d, id) => Half::Soft(d, *id),
            PdImp::Hw(h) => Half::Hw(h),
        }
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// `ibv_reg_mr` of a zeroed buffer of `len` bytes that roxe owns; read
    /// and write it with [`Mr::read`] / [`Mr::write`].
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Mr> {
        let imp = match self.half() {
            Half::Soft(d, id) => MrImp::Soft {
                info: d.engine().memory_mut().register_owned(id, len, access)?,
                dev: d.clone(),
                len,
            },
            Half::Hw(h) => MrImp::Hw(h.reg_owned(len, access.0)?),
        };
        Ok(Mr {
            imp,
            pd: self.clone(),
            _dm: None,
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
        let imp = match self.half() {
            Half::Soft(d, id) => MrImp::Soft {
                // SAFETY: the caller upholds register_raw's contract (see
                // above).
                info: unsafe {
                    d.engine()
                        .memory_mut()
                        .register_raw(id, ptr, len, iova, access)?
                },
                dev: d.clone(),
                len,
            },
            // SAFETY: the same contract (valid until the Mr is dropped).
            Half::Hw(h) => MrImp::Hw(unsafe { h.reg_raw(ptr, len, iova, access.0)? }),
        };
        Ok(Mr {
            imp,
            pd: self.clone(),
            _dm: None,
        })
    }

    /// `ibv_reg_mr` with `IBV_ACCESS_ON_DEMAND` (on-demand paging) of
    /// `addr..addr + len` of this process, named `iova` on the wire; `addr`
    /// 0 with `len` `usize::MAX` is an implicit region (the whole address
    /// space). Safe: the memory need not stay mapped. A soft device reaches
    /// it only through `process_vm_readv`/`writev`, so a page that is not
    /// mapped when a request arrives is a remote access error, not a fault;
    /// a real device pages it in through the kernel's ODP.
    pub fn reg_mr_odp(
        &self,
        addr: usize,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        let access = AccessFlags(access.0 | AccessFlags::ON_DEMAND.0);
        let imp = match self.half() {
            Half::Soft(d, id) => MrImp::Soft {
                info: d
                    .engine()
                    .memory_mut()
                    .register_odp(id, addr, len, iova, access)?,
                dev: d.clone(),
                len,
            },
            // SAFETY: an on-demand registration pins nothing and promises
            // nothing about the memory: the kernel resolves each page when
            // the device touches it.
            Half::Hw(h) => MrImp::Hw(unsafe { h.reg_raw(addr as *mut u8, len, iova, access.0)? }),
        };
        Ok(Mr {
            imp,
            pd: self.clone(),
            _dm: None,
        })
    }

    /// `ibv_advise_mr`: prefetch advice for on-demand regions. Each SGE
    /// must name an on-demand region of this PD and lie inside it (EINVAL
    /// otherwise). A soft device resolves every page when it is accessed,
    /// so a valid prefetch has nothing left to do.
    pub fn advise_mr(&self, sges: &[Sge]) -> Result<()> {
        const VERB: &str = "ibv_advise_mr";
        let Half::Soft(d, pd) = self.half() else {
            return Err(verbs(
                VERB,
                Errno::EOPNOTSUPP,
                "through the Rust API on a hardware device",
            ));
        };
        if sges.is_empty() {
            return Err(verbs(VERB, Errno::EINVAL, "no SGE"));
        }
        let e = d.engine();
        for s in sges {
            let Some(info) = e.memory().query(s.lkey) else {
                return Err(verbs(
                    VERB,
                    Errno::EINVAL,
                    format!("no region with lkey {:#x}", s.lkey),
                ));
            };
            let inside = s
                .addr
                .checked_sub(info.addr)
                .and_then(|o| o.checked_add(u64::from(s.length)))
                .is_some_and(|end| end <= info.length);
            if info.pd != pd || !info.access.contains(AccessFlags::ON_DEMAND) || !inside {
                return Err(verbs(
                    VERB,
                    Errno::EINVAL,
                    format!(
                        "lkey {:#x} is not an on-demand region of this PD holding the range",
                        s.lkey
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `ibv_create_qp`. The CQs and SRQ must be of this PD's device.
    pub fn create_qp(&self, init: &QpInit<'_>) -> Result<Qp> {
        let mismatch = || {
            verbs(
                "ibv_create_qp",
                Errno::EINVAL,
                "a CQ or SRQ of another device",
            )
        };
        let imp = match self.half() {
            Half::Soft(d, pd) => {
                let (CqImp::Soft { id: send_cq, .. }, CqImp::Soft { id: recv_cq, .. }) =
                    (&init.send_cq.inner.imp, &init.recv_cq.inner.imp)
                else {
                    return Err(mismatch());
                };
                let srq = match init.srq.map(|s| &s.inner.imp) {
                    None => None,
                    Some(SrqImp::Soft(_, id)) => Some(*id),
                    Some(SrqImp::Hw(_)) => return Err(mismatch()),
                };
                let attr = QpInitAttr {
                    qp_type: init.qp_type,
                    pd,
                    send_cq: *send_cq,
                    recv_cq: *recv_cq,
                    srq,
                    xrcd: None,
                    cap: init.cap,
                    sq_sig_all: init.sq_sig_all,
                };
                QpImp::Soft(d.clone(), d.engine().create_qp(attr)?)
            }
            Half::Hw(h) => {
                let (CqImp::Hw(send_cq), CqImp::Hw(recv_cq)) =
                    (&init.send_cq.inner.imp, &init.recv_cq.inner.imp)
                else {
                    return Err(mismatch());
                };
                let srq = match init.srq.map(|s| &s.inner.imp) {
                    None => None,
                    Some(SrqImp::Hw(s)) => Some(s),
                    Some(SrqImp::Soft(..)) => return Err(mismatch()),
                };
                let c = init.cap;
                let cap = abi::ibv_qp_cap {
                    max_send_wr: c.max_send_wr,
                    max_recv_wr: c.max_recv_wr,
                    max_send_sge: c.max_send_sge,
                    max_recv_sge: c.max_recv_sge,
                    max_inline_data: c.max_inline_data,
                };
                QpImp::Hw(h.create_qp(init.qp_type, send_cq, recv_cq, srq, cap, init.sq_sig_all)?)
            }
        };
        Ok(Qp {
            inner: Arc::new(QpInner {
                imp,
                pd: self.clone(),
                qp_type: init.qp_type,
                _send_cq: init.send_cq.clone(),
                _recv_cq: init.recv_cq.clone(),
                _srq: init.srq.cloned(),
            }),
        })
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let imp = match self.half() {
            Half::Soft(d, pd) => {
                SrqImp::Soft(d.clone(), d.engine().create_srq(pd, max_wr, max_sge)?)
            }
            Half::Hw(h) => SrqImp::Hw(h.create_srq(max_wr, max_sge)?),
        };
        Ok(Srq {
            inner: Arc::new(SrqInner {
                imp,
                _pd: self.clone(),
                _xrcd: None,
                _cq: None,
            }),
        })
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: a shared receive queue of
    /// XRC domain `xrcd` whose receives complete in `cq`. Requests reach it
    /// through any XRC_RECV QP of the domain whose XRCETH names
    /// [`Srq::number`]; RDMA through it is checked against this PD.
    pub fn create_xrc_srq(&self, xrcd: &Xrcd, cq: &Cq, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let x = xrcd.inner.id;
        self.soft_srq_on_cq(cq, Some(xrcd.clone()), "XRC", |e, pd, cq| {
            e.create_xrc_srq(pd, x, cq, max_wr, max_sge)
        })
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_TM`: a tag-matching SRQ whose tag
    /// list holds up to `max_tags` buffers ([`Context::tm_caps`]) and whose
    /// tag-list operations ([`Srq::post_op`]) complete in `cq`. RC QPs
    /// created on it deliver messages by their tag-matching header: see
    /// `roxe_provider::engine::tm` for the rules. Soft devices only.
    pub fn create_tm_srq(&self, cq: &Cq, max_wr: u32, max_sge: u32, max_tags: u32) -> Result<Srq> {
        self.soft_srq_on_cq(cq, None, "tag matching", |e, pd, cq| {
            e.create_tm_srq(pd, cq, max_wr, max_sge, max_tags)
        })
    }

    /// An SRQ of a soft device made by `create` with this PD and `cq`'s
    /// id (XRC and tag-matching SRQs), holding `cq` (and `xrcd`) while it
    /// lives; EOPNOTSUPP naming `what` on a hardware device.
    fn soft_srq_on_cq(
        &self,
        cq: &Cq,
        xrcd: Option<Xrcd>,
        what: &str,
        create: impl FnOnce(
            &mut roxe_provider::engine::Engine,
            roxe_provider::types::PdId,
            CqId,
        ) -> roxe_provider::types::VerbsResult<SrqId>,
    ) -> Result<Srq> {
        let (Half::Soft(d, pd), CqImp::Soft { id: cq_id, .. }) = (self.half(), &cq.inner.imp)
        else {
            return Err(verbs(
                "ibv_create_srq_ex",
                Errno::EOPNOTSUPP,
                format!("{what} through the Rust API on a hardware device"),
            ));
        };
        let id = create(&mut d.engine(), pd, *cq_id)?;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                imp: SrqImp::Soft(d.clone(), id),
                _pd: self.clone(),
                _xrcd: xrcd,
                _cq: Some(cq.clone()),
            }),
        })
    }

    /// `ibv_create_ah`: where UD sends go.
    pub fn create_ah(&self, av: &AddressVector) -> Result<Ah> {
        match self.half() {
            Half::Soft(d, _) => {
                let resolved = d.resolve_av(av).ok_or_else(|| {
                    verbs(
                        "ibv_create_ah",
                        Errno::EINVAL,
                        "RoCE needs a GRH (is_global = 1), except between loopback devices by LID",
                    )
                })?;
                Ok(Ah {
                    _hw: None,
                    _pd: self.clone(),
                    addr: roxe_provider::engine::addr_of_gid(resolved.dgid),
                })
            }
            Half::Hw(h) => {
                let ah = h.create_ah(av)?;
                Ok(Ah {
                    addr: ah.addr,
                    _hw: Some(ah),
                    _pd: self.clone(),
                })
            }
        }
    }
}

impl Pd {
    /// `ibv_alloc_mw`: an unbound memory window of `kind` in this PD.
    /// Bind a type 1 window with [`Qp::bind_mw`], a type 2 window with the
    /// work request [`Mw::bind_wr`] makes. Soft devices only for now
    /// (`EOPNOTSUPP` on a hardware device; C programs reach a real
    /// device's windows through the drop-in).
    pub fn alloc_mw(&self, kind: MwType) -> Result<Mw> {
        match self.half() {
            Half::Soft(d, pd) => {
                let key = d.engine().alloc_mw(pd, kind)?;
                Ok(Mw {
                    dev: d.clone(),
                    index_key: key,
                    kind,
                    _pd: self.clone(),
                })
            }
            Half::Hw(_) => Err(verbs(
                "ibv_alloc_mw",
                Errno::EOPNOTSUPP,
                "memory windows through the Rust API on a hardware device",
            )),
        }
    }
}

impl Context {
    /// `ibv_alloc_dm`: `len` zeroed bytes of device memory aligned to
    /// `2^log_align`, on a soft device a buffer the device owns (at most
    /// `roxe_provider::memory::MAX_DM_SIZE` per device). Copy in and out
    /// with [`Dm::write`] / [`Dm::read`]; register with [`Pd::reg_dm_mr`].
    pub fn alloc_dm(&self, len: usize, log_align: u32) -> Result<Dm> {
        let ContextImp::Soft(d) = &self.inner.imp else {
            return Err(verbs(
                "ibv_alloc_dm",
                Errno::EOPNOTSUPP,
                "device memory through the Rust API on a hardware device",
            ));
        };
        let handle = d.engine().memory_mut().alloc_dm(len, log_align)?;
        Ok(Dm {
            inner: Arc::new(DmInner {
                dev: Arc::clone(d),
                handle,
                len,
                regions: Default::default(),
                _ctx: self.clone(),
            }),
        })
    }
}

impl Context {
    /// `ibv_open_xrcd`: an XRC domain, to group XRC SRQs and the XRC_RECV
    /// QPs that deliver to them.
    pub fn open_xrcd(&self) -> Result<Xrcd> {
        let ContextImp::Soft(d) = &self.inner.imp else {
            return Err(verbs(
                "ibv_open_xrcd",
                Errno::EOPNOTSUPP,
                "XRC through the Rust API on a hardware device",
            ));
        };
        let id = d.engine().open_xrcd();
        Ok(Xrcd {
            inner: Arc::new(XrcdInner {
                dev: Arc::clone(d),
                id,
                _ctx: self.clone(),
            }),
        })
    }
}

struct XrcdInner {
    dev: Arc<Device>,
    id: XrcdId,
    _ctx: Context,
}

impl Drop for XrcdInner {
    fn drop(&mut self) {
        // Its SRQs and QPs each hold an Xrcd: none is left.
        let _ = self.dev.engine().close_xrcd(self.id);
    }
}

/// An XRC domain (`struct ibv_xrcd`). Closed when the last handle, SRQ and
/// QP in it are dropped.
#[derive(Clone)]
pub struct Xrcd {
    inner: Arc<XrcdInner>,
}

impl std::fmt::Debug for Xrcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xrcd")
            .field("id", &self.inner.id.0)
            .finish()
    }
}

impl Xrcd {
    /// `ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`: the receiving half of
    /// XRC connections. It has no queues: each request's XRCETH picks the
    /// domain's SRQ that takes it, whose PD and CQ apply.
    pub fn create_recv_qp(&self) -> Result<XrcRecvQp> {
        let d = &self.inner.dev;
        let qpn = d.engine().create_qp(QpInitAttr {
            qp_type: QpType::XrcRecv,
            pd: roxe_provider::types::PdId(0),
            send_cq: CqId(0),
            recv_cq: CqId(0),
            srq: None,
            xrcd: Some(self.inner.id),
            cap: QpCap::default(),
            sq_sig_all: false,
        })?;
        Ok(XrcRecvQp {
            dev: Arc::clone(d),
            qpn,
            _xrcd: self.clone(),
        })
    }
}

/// An XRC_RECV QP (`IBV_QPT_XRC_RECV`): connected like an RC QP to one
/// XRC_SEND QP, with nothing to post.
pub struct XrcRecvQp {
    dev: Arc<Device>,
    qpn: u32,
    _xrcd: Xrcd,
}

impl Drop for XrcRecvQp {
    fn drop(&mut self) {
        let _ = self.dev.engine().destroy_qp(self.qpn);
    }
}

impl XrcRecvQp {
    /// The QP number (what the XRC_SEND side connects to).
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// `ibv_modify_qp` (the kernel's XRC_TGT rules).
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        let mut attr = *attr;
        if mask.contains(AttrMask::AV) {
            if let Some(av) = self.dev.resolve_av(&attr.av) {
                attr.av = av;
                self.dev.check_route(&av)?;
            }
        }
        Ok(self.dev.engine().modify_qp(self.qpn, &attr, mask)?)
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<QpAttr> {
        Ok(self.dev.engine().query_qp(self.qpn)?.0)
    }

    /// This side's endpoint, with `psn`.
    pub fn endpoint(&self, psn: u32) -> Endpoint {
        Endpoint {
            lid: self.dev.lid(),
            qpn: self.qpn,
            psn,
            gid: self.dev.gid(),
        }
    }

    /// RESET → INIT → RTR → RTS towards the XRC_SEND QP `remote`, as
    /// [`Qp::connect`].
    pub fn connect(
        &self,
        local_psn: u32,
        remote: &Endpoint,
        mtu: Mtu,
        access: AccessFlags,
        timeout: u8,
    ) -> Result<()> {
        let how = Connect {
            qp_type: QpType::XrcRecv,
            local_psn,
            mtu,
            access,
            timeout,
            sgid_index: 0,
            rd_atomic: CONNECT_RD_ATOMIC,
        };
        how.run(remote, |a, m| self.modify(a, m))
    }
}

struct DmInner {
    dev: Arc<Device>,
    handle: u32,
    len: usize,
    /// Regions registered over it (not every clone is one: imported
    /// structs of the drop-in hold clones too).
    regions: AtomicUsize,
    _ctx: Context,
}

/// A region's hold on its device memory, counted in `DmInner::regions`.
struct DmRegion(Dm);

impl DmRegion {
    fn new(dm: &Dm) -> Self {
        dm.inner.regions.fetch_add(1, Ordering::AcqRel);
        DmRegion(dm.clone())
    }
}

impl Drop for DmRegion {
    fn drop(&mut self) {
        self.0.inner.regions.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for DmInner {
    fn drop(&mut self) {
        // Every region over it (each holds a Dm) is gone by now.
        let _ = self.dev.engine().memory_mut().free_dm(self.handle);
    }
}

/// Device memory (`struct ibv_dm`). Freed when the last handle and the
/// last region over it are dropped.
#[derive(Clone)]
pub struct Dm {
    inner: Arc<DmInner>,
}

impl Dm {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// True for an empty buffer (never: `alloc_dm` refuses length 0).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// `ibv_memcpy_to_dm`: offset and length multiples of 4, inside it.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let i = &self.inner;
        Ok(i.dev
            .engine()
            .memory_mut()
            .dm_write(i.handle, offset, data)?)
    }

    /// `ibv_memcpy_from_dm`: offset and length multiples of 4, inside it.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let i = &self.inner;
        Ok(i.dev.engine().memory().dm_read(i.handle, offset, out)?)
    }

    /// Regions are registered over it (`ibv_free_dm` refuses then).
    pub fn has_regions(&self) -> bool {
        self.inner.regions.load(Ordering::Acquire) > 0
    }
}

impl std::fmt::Debug for Dm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dm").field("len", &self.inner.len).finish()
    }
}

impl Pd {
    /// `ibv_reg_dm_mr`: bytes `[offset, offset + len)` of `dm` as a
    /// zero-based memory region (`ZERO_BASED` is required).
    pub fn reg_dm_mr(&self, dm: &Dm, offset: u64, len: usize, access: AccessFlags) -> Result<Mr> {
        let Half::Soft(d, pd) = self.half() else {
            return Err(verbs(
                "ibv_reg_dm_mr",
                Errno::EOPNOTSUPP,
                "on a hardware device",
            ));
        };
        if !Arc::ptr_eq(d, &dm.inner.dev) {
            return Err(verbs(
                "ibv_reg_dm_mr",
                Errno::EINVAL,
                "device memory of another device",
            ));
        }
        let info = d
            .engine()
            .memory_mut()
            .register_dm(pd, dm.inner.handle, offset, len, access)?;
        Ok(Mr {
            imp: MrImp::Soft {
                dev: d.clone(),
                info,
                len,
            },
            pd: self.clone(),
            _dm: Some(DmRegion::new(dm)),
        })
    }
}

/// A memory window (`struct ibv_mw`): a remote key for part of a memory
/// region, with rights of its own, bound and unbound without
/// re-registering. Deallocated on drop: its key stops working at once.
pub struct Mw {
    dev: Arc<Device>,
    /// A key the window had (its index names it in the memory table).
    index_key: u32,
    kind: MwType,
    _pd: Pd,
}

impl Mw {
    /// The window's type.
    pub fn mw_type(&self) -> MwType {
        self.kind
    }

    /// The window's current key (after a bind, the key the bind gave it).
    pub fn rkey(&self) -> u32 {
        self.dev
            .engine()
            .memory()
            .window(self.index_key)
            .map_or(self.index_key, |(_, key)| key)
    }

    /// The key a bind gives the window next: the same index, the next key
    /// byte (`ibv_inc_rkey`).
    pub fn next_rkey(&self) -> u32 {
        let k = self.rkey();
        (k & !0xff) | (k.wrapping_add(1) & 0xff)
    }

    /// A BIND_MW work request binding this window to `[addr, addr + len)`
    /// of `mr` with `access` (remote rights) and the key
    /// [`next_rkey`](Self::next_rkey) (what a type 2 window is bound with,
    /// through `Qp::post_send`; the bind takes effect in send-queue order
    /// and completes as `WcOpcode::BindMw`).
    pub fn bind_wr(&self, wr_id: u64, mr: &Mr, addr: u64, len: u64, access: AccessFlags) -> SendWr {
        let mut wr = SendWr::new(wr_id, SendOpcode::BindMw, Vec::new());
        wr.bind = Some(MwBind {
            mw_rkey: self.rkey(),
            new_rkey: self.next_rkey(),
            mr_lkey: mr.lkey(),
            addr,
            length: len,
            access,
        });
        wr
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let _ = self.dev.engine().dealloc_mw(self.index_key);
    }
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw")
            .field("type", &self.kind)
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

/// A memory region (`struct ibv_mr`).
pub struct Mr {
    /// Dropped first: deregistered before its PD (and its device memory).
    imp: MrImp,
    pd: Pd,
    /// A region over device memory keeps the memory alive.
    _dm: Option<DmRegion>,
}

enum MrImp {
    Soft {
        dev: Arc<Device>,
        info: roxe_provider::memory::MrInfo,
        len: usize,
    },
    Hw(hw::HwMr),
}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        match &self.imp {
            MrImp::Soft { info, .. } => info.lkey,
            MrImp::Hw(h) => h.lkey(),
        }
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        match &self.imp {
            MrImp::Soft { info, .. } => info.rkey,
            MrImp::Hw(h) => h.rkey(),
        }
    }
    /// The address work requests and peers use for byte 0.
    pub fn addr(&self) -> u64 {
        match &self.imp {
            MrImp::Soft { info, .. } => info.addr,
            MrImp::Hw(h) => h.addr(),
        }
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match &self.imp {
            MrImp::Soft { len, .. } => *len,
            MrImp::Hw(h) => h.len(),
        }
    }
    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// An SGE for `[offset, offset + length)` of this region.
    pub fn sge(&self, offset: usize, length: u32) -> Sge {
        Sge {
            addr: self.addr() + offset as u64,
            length,
            lkey: self.lkey(),
        }
    }
    /// `ibv_rereg_mr` without a new translation: move the region to `pd`
    /// (of the same device) and/or give it `access`, keeping its keys.
    /// Peers and QPs of the old PD are refused from then on.
    pub fn rereg(&mut self, pd: Option<&Pd>, access: Option<AccessFlags>) -> Result<()> {
        // SAFETY: no new memory (the translation is kept).
        unsafe { self.rereg_with(pd, access, None) }
    }

    /// `ibv_rereg_mr` with a new translation: the region now covers
    /// `ptr..ptr + len`, addressed as `iova`, optionally in `pd` and with
    /// `access`; its keys stay.
    ///
    /// # Safety
    /// As [`Pd::reg_mr_raw`], for the new memory.
    pub unsafe fn rereg_translation(
        &mut self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        pd: Option<&Pd>,
        access: Option<AccessFlags>,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.rereg_with(pd, access, Some((ptr, len, iova))) }
    }

    /// The byte at `offset` of a region roxe owns, read anew on every call:
    /// what a latency loop polls for the peer's WRITE, as ib_write_lat polls
    /// its buffer. On a soft device this takes the device lock, like
    /// [`read`](Self::read).
    pub fn watch_byte(&self, offset: usize) -> Result<u8> {
        match &self.imp {
            MrImp::Hw(h) => h.watch_byte(offset),
            MrImp::Soft { .. } => {
                let mut b = [0u8; 1];
                self.read(offset, &mut b)?;
                Ok(b[0])
            }
        }
    }

    /// Both re-registrations.
    ///
    /// # Safety
    /// With a translation, as [`Pd::reg_mr_raw`] for its memory.
    unsafe fn rereg_with(
        &mut self,
        pd: Option<&Pd>,
        access: Option<AccessFlags>,
        translation: Option<(*mut u8, usize, u64)>,
    ) -> Result<()> {
        let lkey = self.lkey();
        let MrImp::Soft {
            dev: d,
            info,
            len: old_len,
        } = &mut self.imp
        else {
            return Err(verbs(
                "ibv_rereg_mr",
                Errno(95),
                "re-registration on a hardware device is not built",
            ));
        };
        let new_pd = match pd.map(|p| (p, p.half())) {
            None => None,
            Some((p, Half::Soft(pd_dev, id))) if Arc::ptr_eq(pd_dev, d) => Some((p, id)),
            Some(_) => {
                return Err(verbs(
                    "ibv_rereg_mr",
                    Errno::EINVAL,
                    "a PD of another device",
                ))
            }
        };
        let pd_id = new_pd.map(|(_, id)| id);
        let mut e = d.engine();
        *info = match translation {
            None => e.memory_mut().reregister(lkey, pd_id, access)?,
            Some((ptr, len, iova)) => {
                // SAFETY: the caller upholds register_raw's contract for
                // the new memory.
                let i = unsafe {
                    e.memory_mut()
                        .reregister_translation(lkey, ptr, len, iova, pd_id, access)?
                };
                *old_len = len;
                i
            }
        };
        drop(e);
        if let Some((p, _)) = new_pd {
            self.pd = p.clone();
        }
        Ok(())
    }
    /// Copy bytes out of a region [`Pd::reg_mr`] allocated.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        match &self.imp {
            MrImp::Soft { dev, info, .. } => dev
                .engine()
                .memory()
                .owned_read(info.lkey, offset, out)
                .map_err(|e| verbs("mr.read", Errno::EINVAL, format!("{e:?}"))),
            MrImp::Hw(h) => h.read(offset, out),
        }
    }
    /// Copy bytes into a region [`Pd::reg_mr`] allocated.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        match &self.imp {
            MrImp::Soft { dev, info, .. } => dev
                .engine()
                .memory_mut()
                .owned_write(info.lkey, offset, data)
                .map_err(|e| verbs("mr.write", Errno::EINVAL, format!("{e:?}"))),
            MrImp::Hw(h) => h.write(offset, data),
        }
    }
}

impl Mr {
    /// How many memory windows are bound into this region (`ibv_dereg_mr`
    /// refuses while any is; dropping the `Mr` unbinds them).
    pub fn bound_windows(&self) -> u32 {
        match &self.imp {
            MrImp::Soft { dev, info, .. } => dev.engine().memory().bound_windows(info.lkey),
            MrImp::Hw(_) => 0,
        }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if let MrImp::Soft { dev: d, info, .. } = &self.imp {
            // Windows still bound into it are unbound first: after this no
            // remote access reaches the memory, whatever was bound.
            let _ = d.engine().memory_mut().deregister_unbinding(info.lkey);
        }
    }
}

struct CqInner {
    /// Dropped first: a hardware CQ before its channel and context.
    imp: CqImp,
    /// Kept alive while the CQ is.
    _ctx: Context,
    channel: Option<CompChannel>,
}

enum CqImp {
    Soft {
        dev: Arc<Device>,
        id: CqId,
        /// Completions waiting, readable without the engine lock.
        waiting: Arc<AtomicUsize>,
        /// Consecutive polls that found nothing.
        empty_polls: AtomicU32,
    },
    Hw(hw::HwCq),
}

/// After this many empty polls in a row, `Cq::poll` yields the CPU once: a
/// program spinning on `poll_cq` must leave the progress thread (which
/// delivers its completions) room to run on a small machine.
const EMPTY_POLLS_BEFORE_YIELD: u32 = 64;

/// `ibv_poll_cq` on a soft CQ; `at` receives each completion's engine time
/// (as far as it reaches).
fn poll_soft(
    dev: &Device,
    id: CqId,
    waiting: &AtomicUsize,
    empty_polls: &AtomicU32,
    out: &mut [WorkCompletion],
    at: &mut [u64],
) -> Result<usize> {
    // Nothing waiting: receive in this thread (no hand-over from the
    // progress thread for the completion), and without anything received
    // do not take the engine lock.
    if waiting.load(Ordering::Acquire) == 0
        && !(dev.progress_here() && waiting.load(Ordering::Acquire) > 0)
    {
        let n = empty_polls.fetch_add(1, Ordering::Relaxed);
        if n % EMPTY_POLLS_BEFORE_YIELD == EMPTY_POLLS_BEFORE_YIELD - 1 {
            std::thread::yield_now();
        }
        return Ok(0);
    }
    empty_polls.store(0, Ordering::Relaxed);
    Ok(dev.engine_for_poll().poll_cq_at(id, out, at)?)
}

impl Drop for CqInner {
    fn drop(&mut self) {
        if let CqImp::Soft { dev: d, id, .. } = &self.imp {
            if self.channel.is_some() {
                d.detach_channel(*id);
            }
            let _ = d.engine().destroy_cq(*id);
        }
    }
}

/// A completion queue (`struct ibv_cq`).
#[derive(Clone)]
pub struct Cq {
    inner: Arc<CqInner>,
}

impl Cq {
    /// This CQ's id (what channel events carry).
    pub fn id(&self) -> CqId {
        match &self.inner.imp {
            CqImp::Soft { id, .. } => *id,
            CqImp::Hw(h) => CqId(h.id),
        }
    }
    /// `ibv_poll_cq`: fill `out`, return how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        match &self.inner.imp {
            CqImp::Hw(h) => h.poll(out),
            CqImp::Soft {
                dev,
                id,
                waiting,
                empty_polls,
            } => poll_soft(dev, *id, waiting, empty_polls, out, &mut []),
        }
    }
    /// [`poll`](Self::poll) with each completion's time, as
    /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK` gives it: nanoseconds
    /// since the Unix epoch, monotonic within a device (its clock anchored
    /// to the wall clock when it opened), taken when the device made the
    /// completion. Soft devices only (EOPNOTSUPP on hardware).
    pub fn poll_with_wallclock(
        &self,
        out: &mut [WorkCompletion],
        wallclock_ns: &mut [u64],
    ) -> Result<usize> {
        match &self.inner.imp {
            CqImp::Hw(_) => Err(verbs(
                "ibv_start_poll",
                Errno(95),
                "completion wall-clock times on a hardware CQ are not built",
            )),
            CqImp::Soft {
                dev,
                id,
                waiting,
                empty_polls,
            } => {
                let n = poll_soft(dev, *id, waiting, empty_polls, out, wallclock_ns)?;
                for t in wallclock_ns.iter_mut().take(n) {
                    *t = dev.wallclock_ns(*t);
                }
                Ok(n)
            }
        }
    }
    /// `ibv_resize_cq` (soft devices): hold up to `depth` completions;
    /// EINVAL below the number waiting.
    pub fn resize(&self, depth: u32) -> Result<()> {
        match &self.inner.imp {
            CqImp::Soft { dev, id, .. } => Ok(dev.engine().resize_cq(*id, depth)?),
            CqImp::Hw(_) => Err(verbs(
                "ibv_resize_cq",
                Errno(95),
                "resizing a hardware CQ is not built",
            )),
        }
    }
    /// `ibv_req_notify_cq`: the next completion (or the next solicited one)
    /// raises one event on the channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let (id, d) = match &self.inner.imp {
            CqImp::Soft { dev, id, .. } => (*id, dev),
            CqImp::Hw(h) => return h.req_notify(solicited_only),
        };
        let mut e = d.engine();
        let cq = e
            .cq_mut(id)
            .ok_or_else(|| verbs("ibv_req_notify_cq", Errno::EINVAL, "CQ destroyed"))?;
        cq.request_notify(solicited_only);
        drop(e);
        // The program is about to sleep on its channel: the progress
        // thread must receive from now on.
        d.caller_sleeps();
        Ok(())
    }
    /// Poll until `n` completions arrived or `timeout` passed (spinning,
    /// then yielding): a convenience for examples and tests.
    pub fn poll_wait(&self, n: usize, timeout: Duration) -> Result<Vec<WorkCompletion>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut out = Vec::with_capacity(n);
        let mut buf = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 32];
        let backoff = crossbeam_utils::Backoff::new();
        while out.len() < n {
            let k = self.poll(&mut buf[..(n - out.len()).min(32)])?;
            out.extend_from_slice(&buf[..k]);
            if k > 0 {
                backoff.reset();
            } else {
                if std::time::Instant::now() >= deadline {
                    return Err(verbs(
                        "ibv_poll_cq",
                        Errno::ETIMEDOUT,
                        format!("{} of {n} completions after {timeout:?}", out.len()),
                    ));
                }
                backoff.snooze();
            }
        }
        Ok(out)
    }
}

struct SrqInner {
    /// Dropped first: a hardware SRQ before its PD.
    imp: SrqImp,
    /// Kept alive while the SRQ is.
    _pd: Pd,
    /// An XRC SRQ's domain, kept alive while it is.
    _xrcd: Option<Xrcd>,
    /// An XRC SRQ's receive CQ, or a tag-matching SRQ's (of its tag-list
    /// operations), kept alive while it is.
    _cq: Option<Cq>,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // The QPs using it hold it: none is left.
        if let SrqImp::Soft(d, id) = &self.imp {
            let _ = d.engine().destroy_srq(*id);
        }
    }
}

enum SrqImp {
    Soft(Arc<Device>, SrqId),
    Hw(hw::HwSrq),
}

/// A shared receive queue (`struct ibv_srq`).
#[derive(Clone)]
pub struct Srq {
    inner: Arc<SrqInner>,
}

impl Srq {
    /// `ibv_get_srq_num`: the number an XRC sender puts in its WRs
    /// (`SendWr::xrc_remote_srqn`) to reach this SRQ.
    pub fn number(&self) -> Result<u32> {
        match &self.inner.imp {
            SrqImp::Soft(d, id) => Ok(d.engine().srq_number(*id)?),
            SrqImp::Hw(_) => Err(verbs(
                "ibv_get_srq_num",
                Errno::EOPNOTSUPP,
                "XRC through the Rust API on a hardware device",
            )),
        }
    }

    /// `ibv_post_srq_recv`.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        match &self.inner.imp {
            SrqImp::Soft(d, id) => Ok(d.engine().post_srq_recv(*id, wr)?),
            SrqImp::Hw(h) => h.post_recv(&wr),
        }
    }

    /// `ibv_post_srq_ops` (one operation) on a tag-matching SRQ: applied
    /// at once, completing in its CQ when signaled (always on failure). An
    /// ADD returns the tag's handle (what a DEL names), the others 0.
    pub fn post_op(&self, op: SrqOp) -> Result<u32> {
        match &self.inner.imp {
            // The engine guard's release notifies the CQ's channel.
            SrqImp::Soft(d, id) => Ok(d.engine().post_srq_op(*id, op)?),
            SrqImp::Hw(_) => Err(verbs(
                "ibv_post_srq_ops",
                Errno::EOPNOTSUPP,
                "tag matching through the Rust API on a hardware device",
            )),
        }
    }
}

/// An address handle (`struct ibv_ah`): a resolved UD destination.
#[derive(Clone)]
pub struct Ah {
    /// The hardware AH (dropped first, before its PD).
    _hw: Option<Arc<hw::HwAh>>,
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
    /// Dropped first: a hardware QP before its PD, CQs and SRQ.
    imp: QpImp,
    pd: Pd,
    qp_type: QpType,
    _send_cq: Cq,
    _recv_cq: Cq,
    _srq: Option<Srq>,
}

enum QpImp {
    Soft(Arc<Device>, u32),
    Hw(hw::HwQp),
}

impl Drop for QpInner {
    fn drop(&mut self) {
        if let QpImp::Soft(d, qpn) = &self.imp {
            let _ = d.engine().destroy_qp(*qpn);
        }
    }
}

/// READs and atomics outstanding each way after [`Qp::connect`].
const CONNECT_RD_ATOMIC: u8 = 16;

/// How [`Qp::connect`] and [`XrcRecvQp::connect`] bring a QP to RTS.
struct Connect {
    qp_type: QpType,
    local_psn: u32,
    mtu: Mtu,
    access: AccessFlags,
    timeout: u8,
    sgid_index: u8,
    /// `max_rd_atomic` and `max_dest_rd_atomic`: READs and atomics
    /// outstanding each way.
    rd_atomic: u8,
}

impl Connect {
    /// The three modifies, with the masks `ibv_rc_pingpong` uses for RC/UC
    /// and the kernel's XRC_INI/XRC_TGT rules for the XRC halves.
    fn run(
        &self,
        remote: &Endpoint,
        modify: impl Fn(&QpAttr, AttrMask) -> Result<()>,
    ) -> Result<()> {
        let t = self.qp_type;
        // Which halves of a reliable connection this QP has.
        let responder = matches!(t, QpType::Rc | QpType::XrcRecv);
        let requester = matches!(t, QpType::Rc | QpType::XrcSend);
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: self.access,
            ..QpAttr::default()
        };
        modify(
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        )?;
        a.qp_state = QpState::Rtr;
        a.path_mtu = self.mtu;
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.av = AddressVector {
            dgid: remote.gid,
            sgid_index: self.sgid_index,
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
        if responder {
            a.max_dest_rd_atomic = self.rd_atomic;
            a.min_rnr_timer = 12;
            mask = mask | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        }
        modify(&a, mask)?;
        a.qp_state = QpState::Rts;
        a.sq_psn = self.local_psn;
        let mut mask = AttrMask::STATE | AttrMask::SQ_PSN;
        if t.is_reliable() {
            a.timeout = self.timeout;
            mask |= AttrMask::TIMEOUT;
        }
        if requester {
            a.retry_cnt = 7;
            a.rnr_retry = 7;
            a.max_rd_atomic = self.rd_atomic;
            mask = mask | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC;
        }
        modify(&a, mask)
    }
}

/// A queue pair (`struct ibv_qp`).
#[derive(Clone)]
pub struct Qp {
    inner: Arc<QpInner>,
}

impl Qp {
    fn half(&self) -> Half<'_, u32, &hw::HwQp> {
        match &self.inner.imp {
            QpImp::Soft(d, qpn) => Half::Soft(d, *qpn),
            QpImp::Hw(h) => Half::Hw(h),
        }
    }
    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        match &self.inner.imp {
            QpImp::Soft(_, qpn) => *qpn,
            QpImp::Hw(h) => h.qp_num(),
        }
    }
    /// The transport.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }
    /// The PD.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }
    /// `ibv_modify_qp`. On a soft device, an LID-only address vector
    /// (`is_global = 0`) is routed to the loopback device with that LID.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        match self.half() {
            Half::Soft(dev, qpn) => {
                let mut attr = *attr;
                if mask.contains(AttrMask::AV) {
                    if let Some(av) = dev.resolve_av(&attr.av) {
                        attr.av = av;
                        dev.check_route(&av)?;
                    }
                }
                Ok(dev.engine().modify_qp(qpn, &attr, mask)?)
            }
            Half::Hw(h) => h.modify(attr, mask),
        }
    }
    /// The queue sizes the device granted (`ibv_query_qp`'s `cap`; it
    /// may round up what [`QpInit`] asked for).
    pub fn cap(&self) -> Result<QpCap> {
        match self.half() {
            Half::Soft(d, qpn) => Ok(d.engine().query_qp(qpn)?.1.cap),
            Half::Hw(h) => Ok(h.cap()),
        }
    }
    /// `ibv_query_qp`: the attributes and the current state.
    pub fn query(&self) -> Result<QpAttr> {
        match self.half() {
            Half::Soft(d, qpn) => Ok(d.engine().query_qp(qpn)?.0),
            Half::Hw(h) => h.query(),
        }
    }
    /// `ibv_post_send`.
    pub fn post_send(&self, wr: SendWr) -> Result<()> {
        match self.half() {
            Half::Soft(d, qpn) => Ok(d.engine_for_post().post_send(qpn, wr)?),
            Half::Hw(h) => h.post_send(&wr),
        }
    }
    /// `ibv_post_send` with a list of work requests (`wr->next`): posted
    /// in order under one device lock, so the packets they make sendable
    /// leave together (one `sendmmsg`, runs of equal packets as GSO sends)
    /// instead of one system call per request. Stops at the first request
    /// refused, as `bad_wr` does: `Err((index, error))`, the requests before
    /// it posted.
    pub fn post_send_list(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> std::result::Result<(), (usize, Error)> {
        match self.half() {
            Half::Soft(d, qpn) => {
                let mut engine = d.engine_for_post_list();
                for (i, wr) in wrs.into_iter().enumerate() {
                    engine.post_send(qpn, wr).map_err(|e| (i, e.into()))?;
                }
                Ok(())
            }
            Half::Hw(h) => {
                for (i, wr) in wrs.into_iter().enumerate() {
                    h.post_send(&wr).map_err(|e| (i, e))?;
                }
                Ok(())
            }
        }
    }
    /// `ibv_bind_mw`: bind the type 1 window `mw` to `[addr, addr + len)`
    /// of `mr` (`None` with length 0 unbinds it) with `access`, in
    /// send-queue order; the bind completes as `WcOpcode::BindMw` with
    /// `wr_id` when `flags` (or the QP) asks for a completion. Returns the
    /// window's new key, which works once the bind has executed. EINVAL
    /// for a type 2 window or an MR of another PD (libibverbs' checks).
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw(
        &self,
        mw: &Mw,
        mr: Option<&Mr>,
        addr: u64,
        len: u64,
        access: AccessFlags,
        wr_id: u64,
        flags: SendFlags,
    ) -> Result<u32> {
        if mw.kind != MwType::Type1 {
            return Err(verbs("ibv_bind_mw", Errno::EINVAL, "not a type 1 window"));
        }
        if mr.is_none() && (addr != 0 || len != 0) {
            return Err(verbs("ibv_bind_mw", Errno::EINVAL, "a range without an MR"));
        }
        let new_rkey = mw.next_rkey();
        let mut wr = SendWr::new(wr_id, SendOpcode::BindMw, Vec::new());
        wr.flags = flags;
        wr.bind = Some(MwBind {
            mw_rkey: mw.rkey(),
            new_rkey,
            mr_lkey: mr.map_or(0, Mr::lkey),
            addr,
            length: len,
            access,
        });
        self.post_send(wr)?;
        Ok(new_rkey)
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        match self.half() {
            Half::Soft(d, qpn) => Ok(d.engine().post_recv(qpn, wr)?),
            Half::Hw(h) => h.post_recv(&wr),
        }
    }

    /// `ibv_post_recv` with a list of work requests (`wr->next`): posted
    /// in order under one device lock (one lock and one pass for the list,
    /// not one per request). Stops at the first request refused, as
    /// `bad_wr` does: `Err((index, error))`, the requests before it posted.
    pub fn post_recv_list(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> std::result::Result<(), (usize, Error)> {
        match self.half() {
            Half::Soft(d, qpn) => {
                let mut engine = d.engine();
                for (i, wr) in wrs.into_iter().enumerate() {
                    engine.post_recv(qpn, wr).map_err(|e| (i, e.into()))?;
                }
                Ok(())
            }
            Half::Hw(h) => {
                for (i, wr) in wrs.into_iter().enumerate() {
                    h.post_recv(&wr).map_err(|e| (i, e))?;
                }
                Ok(())
            }
        }
    }
}

/// What two sides exchange out of band to connect an RC/UC QP pair
/// (serialisable with the `serde` feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
    /// This side's endpoint (GID and LID of its device; on hardware the
    /// GID at [`Context::default_gid_index`]), with `psn`.
    pub fn endpoint(&self, psn: u32) -> Endpoint {
        let (lid, gid) = match self.half() {
            Half::Soft(d, _) => (d.lid(), d.gid()),
            Half::Hw(h) => {
                let ctx = h.context();
                (
                    ctx.port_attr(1).map_or(0, |p| p.lid),
                    ctx.query_gid(1, u32::from(h.gid_index()))
                        .unwrap_or([0; 16]),
                )
            }
        };
        Endpoint {
            lid,
            qpn: self.qp_num(),
            psn,
            gid,
        }
    }

    /// RESET → INIT → RTR → RTS towards `remote` with the usual attributes
    /// (the modify masks `ibv_rc_pingpong` uses): `access` for the remote
    /// side, path MTU `mtu`, `timeout`/`retry_cnt`/`rnr_retry` as given.
    /// On hardware the source GID is [`Context::default_gid_index`] and
    /// the path MTU at most the port's active MTU.
    pub fn connect(
        &self,
        local_psn: u32,
        remote: &Endpoint,
        mtu: Mtu,
        access: AccessFlags,
        timeout: u8,
    ) -> Result<()> {
        self.connect_with_outstanding(local_psn, remote, mtu, access, timeout, CONNECT_RD_ATOMIC)
    }

    /// [`connect`](Self::connect) with `rd_atomic` READs and atomics
    /// outstanding each way (`max_rd_atomic`, `max_dest_rd_atomic`;
    /// `connect` uses 16). At most the device's `max_qp_init_rd_atom` and
    /// `max_qp_rd_atom` ([`DeviceAttr`]), else the modify fails with
    /// EINVAL, as `ibv_modify_qp` does.
    pub fn connect_with_outstanding(
        &self,
        local_psn: u32,
        remote: &Endpoint,
        mtu: Mtu,
        access: AccessFlags,
        timeout: u8,
        rd_atomic: u8,
    ) -> Result<()> {
        let (mtu, sgid_index) = match self.half() {
            Half::Soft(..) => (mtu, 0),
            Half::Hw(h) => {
                let active = h.context().port_attr(1).map_or(mtu, |p| p.active_mtu);
                (mtu.min(active), h.gid_index())
            }
        };
        let how = Connect {
            qp_type: self.inner.qp_type,
            local_psn,
            mtu,
            access,
            timeout,
            sgid_index,
            rd_atomic,
        };
        how.run(remote, |a, m| self.modify(a, m))
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
