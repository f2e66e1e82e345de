//! `ROXE_ICRC=raw` without `CAP_NET_RAW`: `Device::open` fails with EPERM
//! and says why, never falling back to the UDP socket.
//!
//! The capability is dropped from the effective set of one thread only
//! (Linux capabilities are per thread), so this runs as root alongside other
//! tests; without the capability in the first place the drop is a no-op.

use roxe_provider::driver::{Device, DeviceConfig, IcrcMode, NeedsCapNetRaw};
use std::io;
use std::net::IpAddr;

const CAP_NET_RAW: u32 = 13;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Clear CAP_NET_RAW from the calling thread's effective set.
fn drop_cap_net_raw_in_this_thread() {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0, // the calling thread
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two CapData (version 3) through a pointer to a
    // live array of two, and reads the header it is given.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut hdr as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "capget: {}", io::Error::last_os_error());
    data[0].effective &= !(1 << CAP_NET_RAW);
    // SAFETY: capset reads the header and two CapData from live values.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", io::Error::last_os_error());
}

#[test]
fn raw_mode_without_cap_net_raw_fails_with_eperm() {
    let err = std::thread::spawn(|| {
        drop_cap_net_raw_in_this_thread();
        let cfg = DeviceConfig {
            addr: Some(IpAddr::V4(roxe_testnet::addr())),
            icrc: IcrcMode::Raw,
            ..DeviceConfig::default()
        };
        let err = Device::open(&cfg).expect_err("raw mode opened without CAP_NET_RAW");
        // Other modes need no capability (the address is free again).
        let strict = DeviceConfig {
            icrc: IcrcMode::Strict,
            ..cfg
        };
        drop(Device::open(&strict).expect("strict mode needs no capability"));
        err
    })
    .join()
    .unwrap();
    assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("ROXE_ICRC=raw needs CAP_NET_RAW"), "{msg}");
    assert!(
        err.get_ref().is_some_and(|e| e.is::<NeedsCapNetRaw>()),
        "{err:?}"
    );
    let os = std::error::Error::source(&err)
        .and_then(|e| e.downcast_ref::<io::Error>())
        .and_then(io::Error::raw_os_error);
    assert_eq!(os, Some(libc::EPERM), "{err:?}");
}
