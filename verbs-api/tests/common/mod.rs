//! Helpers shared by the verbs API's integration tests.
// Each test crate includes this module and uses part of it.
#![allow(dead_code)]

use roxe_verbs::*;

/// Open soft device `name` on `addr` (each test its own loopback address).
pub fn open(name: &str, addr: &str) -> Context {
    open_with(name, addr, DeviceConfig::default())
}

/// [`open`] with the rest of the configuration from `base`.
pub fn open_with(name: &str, addr: &str, base: DeviceConfig) -> Context {
    let config = DeviceConfig {
        addr: Some(addr.parse().expect("a loopback address")),
        ..base
    };
    device_with(name, config)
        .open()
        .expect("open a soft device")
}
