//! Real devices through the drop-in (`src/passthrough.rs`), without RDMA
//! hardware: a second copy of the drop-in, which the pass-through loads as
//! the system library (`ROXE_SYSTEM_LIBIBVERBS` + `ROXE_HW_ALLOW_DROP_IN=1`),
//! plays mlx5 or rxe. Its devices are listed after roxe's, and every verb
//! on them must reach it through the forwarding (the outer library never
//! sees their objects as its own). Both copies read `ROXE_ADDR`, so each
//! test gives two addresses: the inner copy's devices sit at the same
//! addresses as the outer's, and each test opens them so that no address
//! is opened twice.

mod common;

use common::{lib_dir, run_one, run_pair, scratch, Net, Side};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `Side` with the inner copy of the drop-in as the system library.
fn with_system(side: Side) -> Side {
    side.env("ROXE_SYSTEM_LIBIBVERBS", common::library())
        .env("ROXE_HW_ALLOW_DROP_IN", "1")
}

/// The device names `ibv_devices` printed, in order.
fn listed(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let name = w.next()?;
            let guid = w.next()?;
            (guid.len() == 16 && guid.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| name.to_string())
        })
        .collect()
}

#[test]
fn real_devices_are_listed_after_roxes_and_can_be_hidden() {
    if !common::programs_installed("real_devices_are_listed_after_roxes_and_can_be_hidden") {
        return;
    }
    let net = Net::new();
    let addrs = format!("{},{}", net.server(0), net.client(0));
    // The machine's own system library (where installed): on a machine
    // without RDMA devices it lists none, and the list is roxe's alone.
    let r = run_one(&Side::new("ibv_devices", &addrs, &[]));
    assert!(r.ok(), "{r:?}");
    assert_eq!(listed(&r.stdout), ["roxe0", "roxe1"], "{r:?}");
    // roxe's two devices, then the inner copy's two.
    let r = run_one(&with_system(Side::new("ibv_devices", &addrs, &[])));
    assert!(r.ok(), "{r:?}");
    assert_eq!(
        listed(&r.stdout),
        ["roxe0", "roxe1", "roxe0", "roxe1"],
        "{r:?}"
    );
    for (var, value, want) in [
        ("ROXE_SYSTEM_DEVICES", "0", &["roxe0", "roxe1"]),
        ("ROXE_BACKEND", "soft", &["roxe0", "roxe1"]),
        // Only the system's: these are the inner copy's.
        ("ROXE_BACKEND", "hardware", &["roxe0", "roxe1"]),
    ] {
        let r = run_one(&with_system(Side::new("ibv_devices", &addrs, &[])).env(var, value));
        assert!(r.ok(), "{var}={value}: {r:?}");
        assert_eq!(listed(&r.stdout), want, "{var}={value}: {r:?}");
    }
    // ibv_devinfo opens a passed-through device (ROXE_BACKEND=hardware:
    // roxe1 is the inner copy's) and queries it through the forwarding.
    let r = run_one(
        &with_system(Side::new("ibv_devinfo", &addrs, &["-d", "roxe1", "-v"]))
            .env("ROXE_BACKEND", "hardware"),
    );
    assert!(r.ok(), "{r:?}");
    let gid = format!("::ffff:{}", net.client(0));
    assert!(r.stdout.contains(&gid), "no {gid} in {r:?}");
}

/// ibv_rc_pingpong with completion events on a device of the "system"
/// library (the inner copy, reached only through the forwarding) against
/// one on roxe's own soft device.
#[test]
fn rc_pingpong_on_a_passed_through_device() {
    if !common::programs_installed("rc_pingpong_on_a_passed_through_device") {
        return;
    }
    let net = Net::new();
    let port = net.port(1).to_string();
    let server = Side::new(
        "ibv_rc_pingpong",
        &net.server(1),
        &["-d", "roxe0", "-g", "0", "-p", &port, "-e", "-n", "200"],
    );
    // The client's list holds only the system's devices; its roxe0 is the
    // inner copy's, at the client address.
    let client = with_system(Side::new(
        "ibv_rc_pingpong",
        &net.client(1),
        &["-d", "roxe0", "-g", "0", "-p", &port, "-e", "-n", "200"],
    ))
    .env("ROXE_BACKEND", "hardware")
    .arg(net.server(1));
    let p = run_pair(&server, &client, net.port(1));
    p.assert_ok();
    p.assert_both_contain("\n200 iters in ");
}

fn have_cc_and_header() -> bool {
    let cc = Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let header = Path::new("/usr/include/infiniband/verbs.h").is_file();
    if !(cc && header) {
        assert!(
            std::env::var_os("CI").is_none(),
            "cc or libibverbs-dev missing (required under CI)"
        );
        eprintln!("SKIPPED: cc or /usr/include/infiniband/verbs.h missing");
    }
    cc && header
}

fn compile(name: &str) -> PathBuf {
    let dir = scratch(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/c/{name}.c"));
    let exe = dir.join(name);
    let out = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", lib_dir().display()))
        .arg("-l:libibverbs.so.1")
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// One program uses roxe's soft device and a passed-through "real" one at
/// the same time, connected to each other: SENDs both ways and a WRITE;
/// then each context is imported through a dup of its `cmd_fd` (the real
/// one's by the system library) with its PD and MR. (The inner copy shares
/// the outer's layouts, so this cannot tell whether the outer library
/// records the imported real context as the system's: by inspection it
/// does, as `ibv_open_device` does.)
#[test]
fn one_program_uses_a_soft_and_a_real_device_side_by_side() {
    if !have_cc_and_header() {
        return;
    }
    let exe = compile("side_by_side");
    let net = Net::new();
    // roxe0 (soft, first address) and the inner copy's roxe1 (second
    // address, the list's last): no address is opened twice.
    let addrs = format!("{},{}", net.server(0), net.client(0));
    let r = run_one(&with_system(Side::new(exe.to_str().unwrap(), &addrs, &[])));
    assert!(r.ok(), "{r:?}");
    assert!(r.stdout.contains("first: roxe0, last: roxe1"), "{r:?}");
    assert!(
        r.stdout.contains("imported: roxe0") && r.stdout.contains("imported: roxe1"),
        "{r:?}"
    );
    assert!(r.stdout.contains("side by side: ok"), "{r:?}");
}
