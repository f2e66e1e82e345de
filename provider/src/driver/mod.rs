//! The I/O driver: puts an [`Engine`](crate::engine::Engine) on a real UDP
//! socket (port 4791) with a progress thread, completion channels, a pcap
//! tap and a fault injector. `device.rs` states the threading contract;
//! `pacing.rs` makes every decision about when the threads send, receive
//! and sleep.

mod batch;
mod bind;
mod channel;
mod config;
mod counters;
mod device;
mod exit;
mod fault;
mod guard;
#[cfg(feature = "testing")]
mod hooks;
mod lid;
mod netdev;
mod pacing;
mod pass;
mod progress;
mod raw;
mod receive;
mod shared;
mod slack;
mod socket;
pub mod stat;
mod steering;
mod tap;

pub use bind::{next_auto_addr, SHARED_MODE_PORT};
pub use channel::CompChannel;
pub use config::{parse_switch, ConfigError, DeviceConfig, FaultSpec, IcrcMode};
pub use counters::{DeviceStats, DriverStats};
pub use device::{Device, ROCEV2_PORT};
pub use fault::FaultStats;
pub use guard::EngineGuard;
#[cfg(feature = "testing")]
pub use hooks::BatchHold;
pub use lid::{addr_of_lid, lid_of};
pub use netdev::interface_of;
pub use pacing::{
    CallerReceive, PacingConfig, CALLER_HOLD, EMPTY_POLLS_BEFORE_YIELD, MIN_CALLER_HOLD,
};
pub use raw::NeedsCapNetRaw;
pub use shared::{CmEventSink, DeferredJob, EventSink};
