//! Finding and opening devices: [`DeviceInfo`] (`struct ibv_device`),
//! [`devices`] and the other lists, and the process's table of open soft
//! devices, which makes opening one twice share it.

use crate::backend::Backed;
use crate::{hw, io, verbs, Backend, Context, DeviceConfig, Errno, Result};
use parking_lot::Mutex;
use roxe_provider::driver::Device;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock, Weak};

/// A device that can be opened (`struct ibv_device`).
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    name: String,
    config: DeviceConfig,
    /// Set for a device of the system library.
    hardware: Option<hw::HardwareDevice>,
}

impl DeviceInfo {
    /// `roxe0`, `roxe1`, ... for a soft device; the system library's name
    /// (`mlx5_0`, `rxe0`, ...) for a hardware one.
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
    /// The configured address (`None`: picked at open, and always on
    /// hardware).
    pub fn addr(&self) -> Option<IpAddr> {
        self.config.addr
    }
    /// The node GUID (`ibv_get_device_guid`). A hardware device's: the
    /// system library's. A soft device's: derived from the address as rxe
    /// derives it from the MAC (EUI-64 style); a device whose address is
    /// chosen at open uses the address it has (open in this process) or
    /// would take if opened now.
    pub fn guid(&self) -> u64 {
        if let Some(h) = &self.hardware {
            return h.guid;
        }
        self.config
            .addr
            .or_else(|| {
                open_devices()
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
            return Ok(Context::new(self.name.clone(), Backed::Hw(h)));
        }
        let device = open_soft(&mut open_devices(), &self.name, &self.config)?;
        Ok(Context::new(self.name.clone(), Backed::Soft(device)))
    }
}

/// The soft device `name` with `config`: the one open in this process
/// (by name, or at the configured address), else a new one, recorded in
/// `open`. The caller holds `open` from choosing the name to here, so two
/// threads never open two devices at one address or under one name.
fn open_soft(
    open: &mut HashMap<String, Weak<Device>>,
    name: &str,
    config: &DeviceConfig,
) -> Result<Arc<Device>> {
    // A device already open at the configured address is that device,
    // whatever it was opened as (rdma_cm opens devices by address).
    let at_addr = config.addr.and_then(|a| {
        open.values()
            .filter_map(Weak::upgrade)
            .find(|d| d.addr() == a)
    });
    let device = match open
        .get(name)
        .and_then(Weak::upgrade)
        .filter(|d| config.addr.is_none_or(|a| d.addr() == a))
        .or(at_addr)
    {
        Some(d) => d,
        None => {
            let d = Arc::new(Device::open(config).map_err(io("ibv_open_device"))?);
            open.insert(name.to_owned(), Arc::downgrade(&d));
            d
        }
    };
    Ok(device)
}

/// Every soft device open in this process, by name.
fn open_devices() -> parking_lot::MappedMutexGuard<'static, HashMap<String, Weak<Device>>> {
    /// The process the devices were opened in, and the devices.
    type Open = (u32, HashMap<String, Weak<Device>>);
    static OPEN: OnceLock<Mutex<Open>> = OnceLock::new();
    let mut open = OPEN.get_or_init(Default::default).lock();
    // A child of fork(2) (Python's multiprocessing, say) inherits its
    // parent's devices without their threads: it opens its own.
    if open.0 != std::process::id() {
        *open = (std::process::id(), HashMap::new());
    }
    parking_lot::MutexGuard::map(open, |o| &mut o.1)
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
    let config = DeviceConfig {
        addr: Some(addr),
        ..DeviceConfig::from_env()?
    };
    // One lock from choosing the name to recording the device: another
    // thread opening another address must not take the same free name
    // (its entry would hide this device, and the next open here would
    // start a second device at the address).
    let mut open = open_devices();
    let live = open.iter().find_map(|(name, d)| {
        d.upgrade()
            .filter(|d| d.addr() == addr)
            .map(|_| name.clone())
    });
    // Named as the listed ones are, after them: roxe<N>, a name a sysfs
    // entry and a shell word can hold (not the address).
    let name = live.unwrap_or_else(|| {
        (listed..)
            .map(|n| format!("roxe{n}"))
            .find(|n| open.get(n).is_none_or(|d| d.upgrade().is_none()))
            .unwrap_or_default()
    });
    let device = open_soft(&mut open, &name, &config)?;
    Ok(Context::new(name, Backed::Soft(device)))
}

/// A GUID from an address: the low 48 bits of its IPv6 (or mapped) form,
/// with 0xFFFE in the middle as EUI-64 does with MACs.
pub(crate) fn guid_of(addr: IpAddr) -> u64 {
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

/// A soft device described in code rather than by the environment.
pub fn device_with(name: impl Into<String>, config: DeviceConfig) -> DeviceInfo {
    DeviceInfo {
        name: name.into(),
        config,
        hardware: None,
    }
}

/// The `uverbs<N>` number the kernel would give a new RDMA device: one
/// past the highest in `/sys/class/infiniband_verbs` (0 when there is
/// none). Soft devices are numbered from here, so their names in
/// `/dev/infiniband` never clash with the kernel's.
pub fn first_free_uverbs() -> u32 {
    std::fs::read_dir("/sys/class/infiniband_verbs")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_prefix("uverbs"))
                        .and_then(|n| n.parse::<u32>().ok())
                })
                .map(|n| n + 1)
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}
