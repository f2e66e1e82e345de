//! The I/O driver: puts an [`Engine`](crate::engine::Engine) on a real UDP
//! socket (port 4791) with a progress thread, completion channels, a pcap
//! tap and a fault injector. See `device.rs` for the threading.

mod batch;
mod channel;
mod config;
mod device;
mod fault;
mod netdev;
mod raw;
mod socket;
pub mod stat;
mod tap;

pub use channel::CompChannel;
pub use config::{parse_switch, ConfigError, DeviceConfig, FaultSpec, IcrcMode};
pub use device::{
    addr_of_lid, lid_of, next_auto_addr, BatchHold, CmEventSink, Device, DeviceStats, DriverStats,
    EngineGuard, EventSink, ROCEV2_PORT, SHARED_MODE_PORT,
};
pub use fault::FaultStats;
pub use netdev::interface_of;
pub use raw::NeedsCapNetRaw;
