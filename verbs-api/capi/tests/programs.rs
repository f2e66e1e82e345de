//! Unmodified RDMA programs over the drop-in `libibverbs.so.1`, as two
//! processes on loopback: `ibv_devices`, `ibv_devinfo`, the rdma-core
//! `ibv_*_pingpong` examples, perftest's `ib_*_bw` / `ib_*_lat`, and the
//! tutorial program of `tests/c/tutorial.c` (compiled here with `cc`); one
//! test captures the RoCE traffic with `ROXE_PCAP` and checks it with
//! `roce-check --strict`.
//!
//! Each program runs with `LD_LIBRARY_PATH` = a scratch directory holding
//! `libibverbs.so.1 -> target/<profile>/libibverbs.so` and its own device
//! address (`ROXE_ADDR`). Each test leases its addresses and TCP ports
//! ([`common::Net`], `roxe_testnet`), so the tests run in parallel. Every
//! run is bounded ([`common::deadline`], 45 s, `ROXE_PROGRAMS_DEADLINE`);
//! when one side fails the other is killed shortly after, and the failure
//! message holds both command lines, exit statuses and outputs.
//!
//! The programs need `ibverbs-utils`, `perftest` and, for the tutorial,
//! `libibverbs-dev` and a C compiler. `cargo test` does not build the
//! cdylib: run `cargo build -p roxe-ibverbs` (same profile) first.

mod common;

use common::{
    captured, check_captures, lib_dir, roce_check, run_one, run_pair, run_pair_within, scratch,
    Net, Pair, Side,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

// ---------------------------------------------------------------------------
// ibv_devices, ibv_devinfo

/// The output with every run of whitespace turned into one space, so
/// checks do not depend on the tools' tab alignment.
fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn ibv_devices_lists_roxe0() {
    if !common::programs_installed("ibv_devices_lists_roxe0") {
        return;
    }
    let net = Net::new();
    let r = run_one(&Side::new("ibv_devices", &net.server(0), &[]));
    assert!(r.ok(), "{r:?}");
    // "    device          \t   node GUID" / "    roxe0  \t<16 hex digits>"
    let line = r
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some("roxe0"))
        .unwrap_or_else(|| panic!("no roxe0 line:\n{r:?}"));
    let guid = line.split_whitespace().nth(1).unwrap_or("");
    assert!(
        guid.len() == 16 && guid.bytes().all(|b| b.is_ascii_hexdigit()),
        "node GUID {guid:?} in {line:?}\n{r:?}"
    );
    assert!(
        squash(&r.stdout).starts_with("device node GUID ------"),
        "{r:?}"
    );
}

#[test]
fn ibv_devinfo_verbose_shows_roxe0() {
    if !common::programs_installed("ibv_devinfo_verbose_shows_roxe0") {
        return;
    }
    let net = Net::new();
    let addr = net.server(0);
    for args in [&["-v"][..], &["-v", "-d", "roxe0"][..], &[][..]] {
        let r = run_one(&Side::new("ibv_devinfo", &addr, args));
        assert!(r.ok(), "{r:?}");
        let out = squash(&r.stdout);
        for want in [
            "hca_id: roxe0",
            "transport: InfiniBand (0)",
            "phys_port_cnt: 1",
            "port: 1",
            "state: PORT_ACTIVE (4)",
            "link_layer: Ethernet",
        ] {
            assert!(out.contains(want), "no {want:?} in\n{r:?}");
        }
        if args.contains(&"-v") {
            // GID index 0 is the device address as an IPv4-mapped GID.
            let gid = format!("GID[ 0]: ::ffff:{addr}");
            assert!(out.contains(&gid), "no {gid:?} in\n{r:?}");
            for want in ["max_qp:", "max_cqe:", "max_mr_size:", "atomic_cap:"] {
                assert!(out.contains(want), "no {want:?} in\n{r:?}");
            }
        }
    }
    // A device that does not exist.
    let r = run_one(&Side::new("ibv_devinfo", &addr, &["-d", "nosuchdev0"]));
    assert!(!r.ok(), "{r:?}");
}

// ---------------------------------------------------------------------------
// ibv_*_pingpong

/// `prog` as server and client (run `i` of test `net`), both with
/// `-d roxe0 -p PORT` and `flags`; the client connects to the server's
/// address.
fn pingpong(net: &Net, i: u16, prog: &str, flags: &[&str]) -> Pair {
    let port = net.port(i).to_string();
    let mut args = vec!["-d", "roxe0", "-p", &port];
    args.extend_from_slice(flags);
    let server = Side::new(prog, &net.server(i), &args);
    let client = Side::new(prog, &net.client(i), &args).arg(net.server(i));
    run_pair(&server, &client, net.port(i))
}

/// The part after the label of every `  <label> ...` line (UD's local
/// line has ": GID" where the others have ", GID").
fn addresses(out: &str, label: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.trim_start().strip_prefix(label))
        .map(|rest| rest.trim().replace(": GID", ", GID"))
        .collect()
}

/// Both sides exit 0, report `iters` exchanges of `size` bytes and no
/// invalid data, and each side's remote addresses are the other's local
/// ones.
fn check_pingpong(p: &Pair, iters: u64, size: u64) {
    p.assert_ok();
    p.assert_both_contain(&format!("\n{iters} iters in "));
    p.assert_both_contain(&format!("{} bytes in ", size * iters * 2));
    for r in [&p.server, &p.client] {
        assert!(!r.stdout.contains("invalid data"), "invalid data:\n{p:?}");
    }
    let (s, c) = (&p.server.stdout, &p.client.stdout);
    let s_local = addresses(s, "local address:");
    assert!(!s_local.is_empty(), "no local address line:\n{p:?}");
    assert_eq!(s_local, addresses(c, "remote address:"), "\n{p:?}");
    assert_eq!(
        addresses(c, "local address:"),
        addresses(s, "remote address:"),
        "\n{p:?}"
    );
}

/// The server's first local address line.
fn server_local(p: &Pair) -> String {
    addresses(&p.server.stdout, "local address:")
        .into_iter()
        .next()
        .unwrap_or_default()
}

#[test]
fn rc_pingpong_gid() {
    if !common::programs_installed("rc_pingpong_gid") {
        return;
    }
    let net = Net::new();
    let p = pingpong(&net, 0, "ibv_rc_pingpong", &["-g", "0", "-n", "100"]);
    check_pingpong(&p, 100, 4096);
    let local = server_local(&p);
    assert!(
        local.ends_with(&format!(", GID ::ffff:{}", net.server(0))),
        "{p:?}"
    );
}

#[test]
fn rc_pingpong_lid_only() {
    if !common::programs_installed("rc_pingpong_lid_only") {
        return;
    }
    let net = Net::new();
    let p = pingpong(&net, 0, "ibv_rc_pingpong", &["-n", "100"]);
    check_pingpong(&p, 100, 4096);
    let local = server_local(&p);
    assert!(
        local.starts_with(&format!("LID {:#06x}, ", net.server_lid(0))),
        "{local:?}\n{p:?}"
    );
    assert!(local.ends_with(", GID ::"), "{local:?}\n{p:?}");
}

#[test]
fn rc_pingpong_events() {
    if !common::programs_installed("rc_pingpong_events") {
        return;
    }
    let p = pingpong(
        &Net::new(),
        0,
        "ibv_rc_pingpong",
        &["-g", "0", "-e", "-n", "100"],
    );
    check_pingpong(&p, 100, 4096);
}

#[test]
fn rc_pingpong_new_send_api() {
    if !common::programs_installed("rc_pingpong_new_send_api") {
        return;
    }
    // -N: ibv_create_qp_ex with send-ops flags and the ibv_wr_* calls.
    let p = pingpong(
        &Net::new(),
        0,
        "ibv_rc_pingpong",
        &["-g", "0", "-N", "-c", "-n", "100"],
    );
    check_pingpong(&p, 100, 4096);
}

/// `-t`: completion timestamps on the device clock
/// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`, `ibv_wc_read_completion_ts`,
/// `hca_core_clock`). Both sides report their receive-to-receive times in
/// clock cycles; a soft device's clock ticks in nanoseconds, so the
/// average is the time per iteration the program measured itself (within
/// a wide factor: the two clocks are read at different points).
#[test]
fn rc_pingpong_timestamps() {
    if !common::programs_installed("rc_pingpong_timestamps") {
        return;
    }
    let p = pingpong(
        &Net::new(),
        0,
        "ibv_rc_pingpong",
        &["-g", "0", "-t", "-n", "100"],
    );
    check_pingpong(&p, 100, 4096);
    for out in [&p.server.stdout, &p.client.stdout] {
        let value = |label: &str| -> f64 {
            out.lines()
                .find_map(|l| l.strip_prefix(label))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {label:?} line\n{p:?}"))
        };
        let min = value("Min receive completion clock cycles =");
        let avg = value("Average receive completion clock cycles =");
        let max = value("Max receive completion clock cycles =");
        let usec_per_iter = out
            .lines()
            .find_map(|l| l.split(" = ").nth(1)?.strip_suffix(" usec/iter"))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no usec/iter\n{p:?}"));
        assert!(
            0.0 < min && min <= avg && avg <= max,
            "{min} {avg} {max}\n{p:?}"
        );
        let ratio = avg / (usec_per_iter * 1000.0);
        assert!(
            (0.2..5.0).contains(&ratio),
            "average {avg} cycles against {usec_per_iter} µs per iteration: not nanoseconds\n{p:?}"
        );
    }
}

#[test]
fn rc_pingpong_validate_buffer() {
    if !common::programs_installed("rc_pingpong_validate_buffer") {
        return;
    }
    // -c: "validate received buffer" (each side checks the peer's marks).
    let p = pingpong(
        &Net::new(),
        0,
        "ibv_rc_pingpong",
        &["-g", "0", "-c", "-n", "100", "-s", "8192"],
    );
    check_pingpong(&p, 100, 8192);
}

#[test]
fn rc_pingpong_events_validate_lid_only_small_rx_depth() {
    if !common::programs_installed("rc_pingpong_events_validate_lid_only_small_rx_depth") {
        return;
    }
    let p = pingpong(
        &Net::new(),
        0,
        "ibv_rc_pingpong",
        &[
            "-e", "-c", "-r", "3", "-n", "100", "-s", "2000", "-m", "512",
        ],
    );
    check_pingpong(&p, 100, 2000);
}

/// ibv_rc_pingpong sizes and path MTUs: (size, MTU, iterations).
#[test]
fn rc_pingpong_sizes_and_mtus() {
    if !common::programs_installed("rc_pingpong_sizes_and_mtus") {
        return;
    }
    let net = Net::new();
    let runs: [(u64, u32, u64); 6] = [
        (1, 256, 100),
        (4096, 256, 50),
        (4096, 512, 100),
        (4096, 2048, 100),
        (1048576, 4096, 10),
        (1048576, 1024, 4),
    ];
    for (i, (size, mtu, iters)) in runs.into_iter().enumerate() {
        let (s, m, n) = (size.to_string(), mtu.to_string(), iters.to_string());
        let p = pingpong(
            &net,
            i as u16,
            "ibv_rc_pingpong",
            &["-g", "0", "-c", "-s", &s, "-m", &m, "-n", &n],
        );
        check_pingpong(&p, iters, size);
    }
}

#[test]
fn uc_pingpong_gid() {
    if !common::programs_installed("uc_pingpong_gid") {
        return;
    }
    let p = pingpong(
        &Net::new(),
        0,
        "ibv_uc_pingpong",
        &["-g", "0", "-n", "100", "-c"],
    );
    check_pingpong(&p, 100, 4096);
}

#[test]
fn uc_pingpong_lid_only_events() {
    if !common::programs_installed("uc_pingpong_lid_only_events") {
        return;
    }
    let p = pingpong(
        &Net::new(),
        0,
        "ibv_uc_pingpong",
        &["-e", "-n", "100", "-s", "1024"],
    );
    check_pingpong(&p, 100, 1024);
}

#[test]
fn ud_pingpong_gid() {
    if !common::programs_installed("ud_pingpong_gid") {
        return;
    }
    // -s must not exceed the port's active MTU (the UD message is one packet).
    let p = pingpong(
        &Net::new(),
        0,
        "ibv_ud_pingpong",
        &["-g", "0", "-n", "100", "-s", "1024", "-c"],
    );
    check_pingpong(&p, 100, 1024);
}

#[test]
fn ud_pingpong_lid_only_events() {
    if !common::programs_installed("ud_pingpong_lid_only_events") {
        return;
    }
    let p = pingpong(
        &Net::new(),
        0,
        "ibv_ud_pingpong",
        &["-e", "-n", "100", "-s", "512"],
    );
    check_pingpong(&p, 100, 512);
}

#[test]
fn srq_pingpong_gid() {
    if !common::programs_installed("srq_pingpong_gid") {
        return;
    }
    let p = pingpong(
        &Net::new(),
        0,
        "ibv_srq_pingpong",
        &["-g", "0", "-n", "100"],
    );
    check_pingpong(&p, 100, 4096);
    // One local address line per QP (16 by default).
    assert_eq!(
        addresses(&p.server.stdout, "local address:").len(),
        16,
        "{p:?}"
    );
}

#[test]
fn srq_pingpong_events() {
    if !common::programs_installed("srq_pingpong_events") {
        return;
    }
    let p = pingpong(
        &Net::new(),
        0,
        "ibv_srq_pingpong",
        &["-g", "0", "-e", "-n", "100", "-q", "4", "-s", "1024"],
    );
    check_pingpong(&p, 100, 1024);
}

#[test]
fn srq_pingpong_lid_only() {
    if !common::programs_installed("srq_pingpong_lid_only") {
        return;
    }
    let p = pingpong(
        &Net::new(),
        0,
        "ibv_srq_pingpong",
        &["-n", "64", "-q", "8", "-c"],
    );
    check_pingpong(&p, 64, 4096);
}

// ---------------------------------------------------------------------------
// perftest

/// The message sizes perftest `-a` runs: 2 .. 2^23.
const ALL_SIZES: &[u64] = &[
    2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072,
    262144, 524288, 1048576, 2097152, 4194304, 8388608,
];

/// perftest `tool` (run `i` of test `net`), both sides with
/// `-d roxe0 -x 0 -p PORT` and `flags`.
fn perftest(net: &Net, i: u16, tool: &str, flags: &[&str]) -> Pair {
    let port = net.port(i).to_string();
    let mut args = vec!["-d", "roxe0", "-x", "0", "-p", &port];
    args.extend_from_slice(flags);
    let server = Side::new(tool, &net.server(i), &args);
    let client = Side::new(tool, &net.client(i), &args).arg(net.server(i));
    // A sweep (-a) runs 23 sizes; the latency tools also spend about 1.5 s
    // per size measuring the CPU clock (perftest's get_cpu_mhz).
    let limit = if flags.contains(&"-a") { 150 } else { 0 };
    run_pair_within(&server, &client, net.port(i), Duration::from_secs(limit))
}

/// The rows of perftest's result table: (#bytes, #iterations, the rest).
fn results(out: &str) -> Vec<(u64, u64, Vec<f64>)> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for l in out.lines() {
        if l.contains("#bytes") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let t: Vec<&str> = l.split_whitespace().collect();
        if t.len() < 3 {
            continue;
        }
        if let (Ok(b), Ok(n)) = (t[0].parse::<u64>(), t[1].parse::<u64>()) {
            let rest = t[2..]
                .iter()
                .filter_map(|x| x.parse::<f64>().ok())
                .collect();
            rows.push((b, n, rest));
        }
    }
    rows
}

/// Both exit 0; the client reports one row per size in `sizes` with
/// `iters` iterations (None: any) and positive figures; so does the server
/// for `server_sizes`, when given.
fn check_perftest(p: &Pair, sizes: &[u64], iters: Option<u64>, server_sizes: Option<&[u64]>) {
    p.assert_ok();
    let mut sides = vec![("client", &p.client, sizes)];
    if let Some(s) = server_sizes {
        sides.push(("server", &p.server, s));
    }
    for (who, r, sizes) in sides {
        assert!(
            r.stdout.contains("roxe0"),
            "{who} does not name the device:\n{p:?}"
        );
        let rows = results(&r.stdout);
        let got: Vec<u64> = rows.iter().map(|r| r.0).collect();
        assert_eq!(got, sizes, "{who}'s result sizes\n{p:?}");
        for (b, n, rest) in &rows {
            if let Some(want) = iters {
                assert_eq!(*n, want, "{who}: iterations for {b} bytes\n{p:?}");
            }
            assert!(
                !rest.is_empty() && rest.iter().any(|v| *v > 0.0),
                "{who}: no positive figure for {b} bytes\n{p:?}"
            );
        }
    }
}

/// One perftest run: tool, flags, test number; the sizes it must report.
fn perftest_case(tool: &str, flags: &[&str], sizes: &[u64]) {
    let p = perftest(&Net::new(), 0, tool, flags);
    let value = |flag: &str| -> Option<u64> {
        let i = flags.iter().position(|f| *f == flag)?;
        Some(flags[i + 1].parse().expect("a number"))
    };
    // With -q, perftest reports the iterations of all QPs together.
    let iters = value("-n").map(|n| n * value("-q").unwrap_or(1));
    // The servers of ib_read_lat and ib_atomic_lat print no results (they
    // only answer); a bandwidth server in a size sweep (-a) reports the
    // last size only; every other server reports what the client reports.
    let server_sizes = match tool {
        "ib_read_lat" | "ib_atomic_lat" => None,
        _ if tool.ends_with("_bw") && flags.contains(&"-a") => Some(&sizes[sizes.len() - 1..]),
        _ => Some(sizes),
    };
    check_perftest(&p, sizes, iters, server_sizes);
}

// The defaults (with `-x 0` and fewer iterations).
#[test]
fn perftest_send_bw() {
    if !common::programs_installed("perftest_send_bw") {
        return;
    }
    perftest_case("ib_send_bw", &["-n", "200"], &[65536]);
}
#[test]
fn perftest_write_bw() {
    if !common::programs_installed("perftest_write_bw") {
        return;
    }
    perftest_case("ib_write_bw", &["-n", "200"], &[65536]);
}
#[test]
fn perftest_read_bw() {
    if !common::programs_installed("perftest_read_bw") {
        return;
    }
    perftest_case("ib_read_bw", &["-n", "200"], &[65536]);
}
#[test]
fn perftest_atomic_bw() {
    if !common::programs_installed("perftest_atomic_bw") {
        return;
    }
    perftest_case("ib_atomic_bw", &["-n", "500"], &[8]);
}
#[test]
fn perftest_send_lat() {
    if !common::programs_installed("perftest_send_lat") {
        return;
    }
    perftest_case("ib_send_lat", &["-n", "500"], &[2]);
}
#[test]
fn perftest_write_lat() {
    if !common::programs_installed("perftest_write_lat") {
        return;
    }
    perftest_case("ib_write_lat", &["-n", "500"], &[2]);
}
#[test]
fn perftest_read_lat() {
    if !common::programs_installed("perftest_read_lat") {
        return;
    }
    perftest_case("ib_read_lat", &["-n", "500"], &[2]);
}
#[test]
fn perftest_atomic_lat() {
    if !common::programs_installed("perftest_atomic_lat") {
        return;
    }
    perftest_case("ib_atomic_lat", &["-n", "500"], &[8]);
}
#[test]
fn perftest_atomic_cmp_and_swap() {
    if !common::programs_installed("perftest_atomic_cmp_and_swap") {
        return;
    }
    perftest_case("ib_atomic_bw", &["-n", "200", "-A", "CMP_AND_SWAP"], &[8]);
}

// Size sweeps: 2 .. 8 MiB.
#[test]
fn perftest_write_bw_all_sizes() {
    if !common::programs_installed("perftest_write_bw_all_sizes") {
        return;
    }
    perftest_case("ib_write_bw", &["-a", "-n", "10"], ALL_SIZES);
}
#[test]
fn perftest_send_lat_all_sizes() {
    if !common::programs_installed("perftest_send_lat_all_sizes") {
        return;
    }
    perftest_case("ib_send_lat", &["-a", "-n", "10"], ALL_SIZES);
}
#[test]
fn perftest_read_bw_all_sizes() {
    if !common::programs_installed("perftest_read_bw_all_sizes") {
        return;
    }
    perftest_case("ib_read_bw", &["-a", "-n", "5"], ALL_SIZES);
}

// Several QPs.
#[test]
fn perftest_write_bw_4_qps() {
    if !common::programs_installed("perftest_write_bw_4_qps") {
        return;
    }
    perftest_case("ib_write_bw", &["-q", "4", "-n", "200"], &[65536]);
}
#[test]
fn perftest_send_bw_4_qps() {
    if !common::programs_installed("perftest_send_bw_4_qps") {
        return;
    }
    perftest_case(
        "ib_send_bw",
        &["-q", "4", "-n", "200", "-s", "4096"],
        &[4096],
    );
}

// Inline sends (-I 64) with messages that fit.
#[test]
fn perftest_send_bw_inline() {
    if !common::programs_installed("perftest_send_bw_inline") {
        return;
    }
    perftest_case("ib_send_bw", &["-I", "64", "-s", "64", "-n", "500"], &[64]);
}
#[test]
fn perftest_write_bw_inline() {
    if !common::programs_installed("perftest_write_bw_inline") {
        return;
    }
    perftest_case("ib_write_bw", &["-I", "64", "-s", "32", "-n", "500"], &[32]);
}
#[test]
fn perftest_send_lat_inline() {
    if !common::programs_installed("perftest_send_lat_inline") {
        return;
    }
    perftest_case("ib_send_lat", &["-I", "64", "-s", "64", "-n", "500"], &[64]);
}
#[test]
fn perftest_write_lat_inline() {
    if !common::programs_installed("perftest_write_lat_inline") {
        return;
    }
    perftest_case(
        "ib_write_lat",
        &["-I", "64", "-s", "16", "-n", "500"],
        &[16],
    );
}

// Completion events (-e), where the tool has it.
#[test]
fn perftest_send_bw_events() {
    if !common::programs_installed("perftest_send_bw_events") {
        return;
    }
    perftest_case("ib_send_bw", &["-e", "-n", "200"], &[65536]);
}
#[test]
fn perftest_read_bw_events() {
    if !common::programs_installed("perftest_read_bw_events") {
        return;
    }
    perftest_case("ib_read_bw", &["-e", "-n", "200"], &[65536]);
}
#[test]
fn perftest_atomic_bw_events() {
    if !common::programs_installed("perftest_atomic_bw_events") {
        return;
    }
    perftest_case("ib_atomic_bw", &["-e", "-n", "200"], &[8]);
}
#[test]
fn perftest_send_lat_events() {
    if !common::programs_installed("perftest_send_lat_events") {
        return;
    }
    perftest_case("ib_send_lat", &["-e", "-n", "200"], &[2]);
}
#[test]
fn perftest_read_lat_events() {
    if !common::programs_installed("perftest_read_lat_events") {
        return;
    }
    perftest_case("ib_read_lat", &["-e", "-n", "200"], &[2]);
}
#[test]
fn perftest_atomic_lat_events() {
    if !common::programs_installed("perftest_atomic_lat_events") {
        return;
    }
    perftest_case("ib_atomic_lat", &["-e", "-n", "200"], &[8]);
}

// Bidirectional (-b) bandwidth.
#[test]
fn perftest_send_bw_bidirectional() {
    if !common::programs_installed("perftest_send_bw_bidirectional") {
        return;
    }
    perftest_case("ib_send_bw", &["-b", "-n", "200"], &[65536]);
}
#[test]
fn perftest_write_bw_bidirectional() {
    if !common::programs_installed("perftest_write_bw_bidirectional") {
        return;
    }
    perftest_case("ib_write_bw", &["-b", "-n", "200"], &[65536]);
}
#[test]
fn perftest_read_bw_bidirectional() {
    if !common::programs_installed("perftest_read_bw_bidirectional") {
        return;
    }
    perftest_case("ib_read_bw", &["-b", "-n", "200"], &[65536]);
}
#[test]
fn perftest_atomic_bw_bidirectional() {
    if !common::programs_installed("perftest_atomic_bw_bidirectional") {
        return;
    }
    perftest_case("ib_atomic_bw", &["-b", "-n", "200"], &[8]);
}

// UC connections.
#[test]
fn perftest_write_bw_uc() {
    if !common::programs_installed("perftest_write_bw_uc") {
        return;
    }
    perftest_case(
        "ib_write_bw",
        &["-c", "UC", "-n", "200", "-s", "4096"],
        &[4096],
    );
}
#[test]
fn perftest_send_bw_ud() {
    if !common::programs_installed("perftest_send_bw_ud") {
        return;
    }
    perftest_case(
        "ib_send_bw",
        &["-c", "UD", "-n", "200", "-s", "1024"],
        &[1024],
    );
}

// ---------------------------------------------------------------------------
// tests/c/tutorial.c

/// The tutorial program, compiled once per test process with
/// `cc -Wall -Werror -O2 ... -libverbs`; None (with a printed reason)
/// without a C compiler.
fn tutorial() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| {
        let Some(cc) = common::c_compiler() else {
            eprintln!("SKIPPED: no `cc` on PATH: the tutorial program is not built");
            return None;
        };
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/c/tutorial.c");
        let bin = lib_dir().join("tutorial");
        let out = Command::new(&cc)
            .args(["-Wall", "-Werror", "-O2", "-o"])
            .arg(&bin)
            .arg(&src)
            .arg("-libverbs")
            .output()
            .expect("run cc");
        assert!(
            out.status.success(),
            "{} -Wall -Werror -O2 -o {} {} -libverbs: {}\n{}{}",
            cc.display(),
            bin.display(),
            src.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(bin)
    })
    .as_deref()
}

fn tutorial_pair(net: &Net, flags: &[&str]) -> Option<Pair> {
    let bin = tutorial()?;
    let bin = bin.to_str().expect("UTF-8 path");
    let port = net.port(0).to_string();
    let mut args = vec!["-d", "roxe0", "-p", &port];
    args.extend_from_slice(flags);
    let server = Side::new(bin, &net.server(0), &args);
    let client = Side::new(bin, &net.client(0), &args).arg(net.server(0));
    Some(run_pair(&server, &client, net.port(0)))
}

fn check_tutorial(p: &Pair, size: u64) {
    p.assert_ok();
    let ok = format!(
        ": OK: SEND/RECV {size} bytes each way, RDMA WRITE {size} bytes, RDMA READ {size} bytes, all verified"
    );
    assert!(p.server.stdout.contains(&format!("server{ok}")), "{p:?}");
    assert!(p.client.stdout.contains(&format!("client{ok}")), "{p:?}");
    assert_eq!(
        addresses(&p.server.stdout, "local: "),
        addresses(&p.client.stdout, "remote:"),
        "{p:?}"
    );
}

#[test]
fn tutorial_gid() {
    if !common::programs_installed("tutorial_gid") {
        return;
    }
    let net = Net::new();
    let Some(p) = tutorial_pair(&net, &["-g", "0", "-s", "65536", "-m", "1024"]) else {
        return;
    };
    check_tutorial(&p, 65536);
    p.assert_both_contain(", GID, MTU 1024, 65536 bytes\n");
    let local = addresses(&p.server.stdout, "local: ").join("\n");
    assert!(
        local.ends_with(&format!(", GID ::ffff:{}", net.server(0))),
        "{p:?}"
    );
}

#[test]
fn tutorial_lid_only() {
    if !common::programs_installed("tutorial_lid_only") {
        return;
    }
    let net = Net::new();
    let Some(p) = tutorial_pair(&net, &[]) else {
        return;
    };
    check_tutorial(&p, 4096);
    p.assert_both_contain(", LID only, ");
    let local = addresses(&p.server.stdout, "local: ").join("\n");
    assert!(
        local.contains(&format!(", LID {:#06x}, ", net.server_lid(0))),
        "{local:?}\n{p:?}"
    );
}

// ---------------------------------------------------------------------------
// ROXE_PCAP captures checked by roce-check

#[test]
fn pcap_captures_pass_roce_check() {
    if !common::programs_installed("pcap_captures_pass_roce_check") {
        return;
    }
    let Some(tool) = roce_check() else {
        eprintln!("SKIPPED: roce-check not found (set ROXE_ROCE_CHECK)");
        return;
    };
    let net = Net::new();
    let dir = scratch("pcap");
    let mut files = Vec::new();

    // ibv_rc_pingpong, 4 KiB messages over a 1024-byte MTU (multi-packet).
    let (p, f) = captured(&dir, "rc_pingpong", |pcap| {
        let port = net.port(0).to_string();
        let args = ["-d", "roxe0", "-p", &port, "-g", "0", "-n", "50", "-c"];
        let server = pcap(
            Side::new("ibv_rc_pingpong", &net.server(0), &args),
            "server",
        );
        let client = pcap(
            Side::new("ibv_rc_pingpong", &net.client(0), &args).arg(net.server(0)),
            "client",
        );
        run_pair(&server, &client, net.port(0))
    });
    check_pingpong(&p, 50, 4096);
    files.extend(f);

    // perftest: RDMA WRITE, RDMA READ and atomics.
    for (i, tool_name, extra) in [
        (1u16, "ib_write_bw", &["-s", "8192", "-n", "50"][..]),
        (2, "ib_read_bw", &["-s", "8192", "-n", "50"][..]),
        (3, "ib_atomic_bw", &["-n", "50"][..]),
    ] {
        let (p, f) = captured(&dir, tool_name, |pcap| {
            let port = net.port(i).to_string();
            let mut args = vec!["-d", "roxe0", "-x", "0", "-p", &port];
            args.extend_from_slice(extra);
            let server = pcap(Side::new(tool_name, &net.server(i), &args), "server");
            let client = pcap(
                Side::new(tool_name, &net.client(i), &args).arg(net.server(i)),
                "client",
            );
            run_pair(&server, &client, net.port(i))
        });
        p.assert_ok();
        files.extend(f);
    }

    let problems = check_captures(&tool, &files);
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

// ---------------------------------------------------------------------------
// rdma-core's logging variables

/// `VERBS_LOG_LEVEL=4 VERBS_LOG_FILE=F`, as for rdma-core's providers: the
/// drop-in writes its events (here the QP state changes to RTS) to F.
#[test]
fn verbs_log_level_and_file_log_qp_states() {
    if !common::programs_installed("verbs_log_level_and_file_log_qp_states") {
        return;
    }
    let net = Net::new();
    let dir = scratch("verbs_log");
    let (slog, clog) = (dir.join("server.log"), dir.join("client.log"));
    let port = net.port(0).to_string();
    let args = ["-g", "0", "-p", &port, "-n", "5"];
    let server = Side::new("ibv_rc_pingpong", &net.server(0), &args)
        .env("VERBS_LOG_LEVEL", "4")
        .env("VERBS_LOG_FILE", slog.as_os_str());
    let client = Side::new("ibv_rc_pingpong", &net.client(0), &args)
        .arg(net.server(0))
        .env("VERBS_LOG_LEVEL", "4")
        .env("VERBS_LOG_FILE", clog.as_os_str());
    let p = run_pair(&server, &client, net.port(0));
    p.assert_ok();
    for f in [&slog, &clog] {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        assert!(
            text.contains("QP state change") && text.contains("to=RTS"),
            "{}: no QP state change to RTS logged:\n{text}\n{p:?}",
            f.display()
        );
    }
}

/// The answers of every roxe device's `roxe stat` socket under `dir`
/// (`$XDG_RUNTIME_DIR/roxe`).
fn stat_answers(dir: &Path) -> Vec<String> {
    use std::io::Read;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let Ok(mut s) = std::os::unix::net::UnixStream::connect(e.path()) else {
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut answer = String::new();
        if s.read_to_string(&mut answer).is_ok() {
            out.push(answer);
        }
    }
    out
}

/// What `roxe stat` reads, from a running `ib_write_bw` over the drop-in:
/// both devices answer, each with its QP facing the other (the client's
/// in RTS) and the traffic counted on it, and their CQs.
#[test]
fn stat_shows_the_qps_of_a_running_ib_write_bw() {
    if !common::programs_installed("stat_shows_the_qps_of_a_running_ib_write_bw") {
        return;
    }
    let net = Net::new();
    let xdg = common::scratch("stat_ib_write_bw");
    let port = net.port(0).to_string();
    let args = ["-d", "roxe0", "-x", "0", "-p", &port, "-D", "3"];
    let server =
        Side::new("ib_write_bw", &net.server(0), &args).env("XDG_RUNTIME_DIR", xdg.as_os_str());
    let client = Side::new("ib_write_bw", &net.client(0), &args)
        .env("XDG_RUNTIME_DIR", xdg.as_os_str())
        .arg(net.server(0));
    let dir = xdg.join("roxe");
    let (server_addr, client_addr) = (net.server(0), net.client(0));
    let watcher = std::thread::spawn(move || {
        let end = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < end {
            let answers = stat_answers(&dir);
            let qp_toward = |me: &str, peer: &str, state: &str, moving: &str| {
                answers.iter().any(|a| {
                    a.lines()
                        .next()
                        .is_some_and(|d| d.contains(&format!("addr={me} ")))
                        && a.lines().any(|l| {
                            l.starts_with("qp ")
                                && l.contains(&format!("state={state} "))
                                && l.contains(&format!("peer={peer} "))
                                && !l.contains(&format!(" {moving}=0 "))
                        })
                })
            };
            // perftest's write server takes its QP only to RTR: it never
            // sends a request, only the ACKs its responder makes.
            if qp_toward(&client_addr, &server_addr, "RTS", "tx_packets")
                && qp_toward(&server_addr, &client_addr, "RTR", "rx_packets")
            {
                return Ok(answers);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(stat_answers(&dir))
    });
    let p = run_pair_within(&server, &client, net.port(0), Duration::from_secs(0));
    p.assert_ok();
    match watcher.join().expect("the stat watcher") {
        Ok(answers) => assert!(answers.iter().all(|a| a.contains("cq id=")), "{answers:?}"),
        Err(last) => {
            panic!("the QPs of both devices not in roxe stat: {last:#?}\n{p:?}")
        }
    }
}

/// The tutorial through memory windows (`-w 1`, `-w 2`), two processes over
/// the drop-in: the peer's buffer reached through a window's key, the window
/// ended (type 2 by the peer's SEND_WITH_INV, reported in the receive
/// completion; type 1 by deallocation) and its key refused with
/// REM_ACCESS_ERR; every packet captured and passed through roce-check.
#[test]
fn tutorial_memory_windows() {
    if !common::programs_installed("tutorial_memory_windows") {
        return;
    }
    let Some(bin) = tutorial() else {
        return;
    };
    let bin = bin.to_str().expect("UTF-8 path").to_string();
    let net = Net::new();
    let dir = scratch("tutorial_mw");
    let mut files = Vec::new();
    for (i, kind) in [(0u16, "1"), (1, "2")] {
        let (p, f) = captured(&dir, &format!("mw{kind}"), |pcap| {
            let port = net.port(i).to_string();
            let args = [
                "-d", "roxe0", "-p", &port, "-g", "0", "-s", "8192", "-m", "1024", "-w", kind,
            ];
            let server = pcap(Side::new(&bin, &net.server(i), &args), "server");
            let client = pcap(
                Side::new(&bin, &net.client(i), &args).arg(net.server(i)),
                "client",
            );
            run_pair(&server, &client, net.port(i))
        });
        check_tutorial(&p, 8192);
        let ended = if kind == "2" {
            "SEND_WITH_INV reported"
        } else {
            "deallocated"
        };
        assert!(
            p.client.stdout.contains(&format!(
                "client: OK: window type {kind} ended ({ended}), its key refused"
            )),
            "{p:?}"
        );
        assert!(
            p.server
                .stdout
                .contains(&format!("server: OK: window type {kind} ended ({ended})")),
            "{p:?}"
        );
        files.extend(f);
    }
    match roce_check() {
        Some(tool) => {
            let problems = check_captures(&tool, &files);
            assert!(problems.is_empty(), "{problems:?}");
        }
        None => assert!(
            std::env::var_os("CI").is_none(),
            "roce-check not found (set ROXE_ROCE_CHECK)"
        ),
    }
}

/// `roxe perf` built for this test run (target/<profile>/roxe).
fn roxe_tool() -> std::path::PathBuf {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    common::cargo_build(
        &[
            "-p",
            "roxe-tools",
            "--bin",
            "roxe",
            "--manifest-path",
            manifest,
        ],
        "roxe",
    )
    .join("roxe")
}

/// A script written for `ib_write_bw` works with `roxe perf write` after
/// changing the program name: the same perftest arguments on both sides
/// (`-d DEV -x GID -s SIZE -n ITERS -p PORT`, a bare server address for the
/// client) and the same table, read by the same parser as perftest's.
#[test]
fn roxe_perf_takes_an_ib_write_bw_script() {
    if !common::programs_installed("roxe_perf_takes_an_ib_write_bw_script") {
        return;
    }
    let roxe = roxe_tool();
    let net = Net::new();
    for (i, prog) in [
        (0u16, "ib_write_bw".to_string()),
        (1, format!("{} perf write", roxe.display())),
    ] {
        let port = net.port(i).to_string();
        let args = [
            "-d", "roxe0", "-x", "0", "-s", "65536", "-n", "200", "-p", &port,
        ];
        let mut words = prog.split(' ');
        let program = words.next().expect("a program");
        let mut all: Vec<&str> = words.collect();
        all.extend(args);
        let server = Side::new(program, &net.server(i), &all);
        let client = Side::new(program, &net.client(i), &all).arg(net.server(i));
        let p = run_pair(&server, &client, net.port(i));
        p.assert_ok();
        let rows = results(&p.client.stdout);
        assert_eq!(rows.len(), 1, "{prog}: one row\n{p:?}");
        let (bytes, iters, rest) = &rows[0];
        assert_eq!((*bytes, *iters), (65536, 200), "{prog}\n{p:?}");
        assert!(
            rest.len() >= 3 && rest.iter().all(|v| *v > 0.0),
            "{prog}: BW peak, BW average and message rate\n{p:?}"
        );
    }
}

/// libibverbs' XRC example `ibv_xsrq_pingpong` (XRC domain shared through a
/// file, an XRC SRQ, XRC_RECV and XRC_SEND QPs, `ibv_get_srq_num`, CQ
/// events), 10,000-byte messages over a 1024-byte MTU, as two processes:
/// both succeed, and both captures pass `roce-check --strict`, every
/// request an XRC opcode whose XRCETH names the SRQ number the peer
/// printed, every response an XRC one.
#[test]
fn xsrq_pingpong_runs_xrc_on_the_wire() {
    if !common::programs_installed("xsrq_pingpong_runs_xrc_on_the_wire") {
        return;
    }
    let net = Net::new();
    let dir = scratch("xsrq_pingpong");
    let (p, files) = captured(&dir, "xsrq", |pcap| {
        let port = net.port(0).to_string();
        let args = [
            "-d", "roxe0", "-g", "0", "-p", &port, "-s", "10000", "-m", "1024", "-n", "20", "-e",
        ];
        let server = pcap(
            Side::new("ibv_xsrq_pingpong", &net.server(0), &args),
            "server",
        );
        let client = pcap(
            Side::new("ibv_xsrq_pingpong", &net.client(0), &args).arg(net.server(0)),
            "client",
        );
        run_pair(&server, &client, net.port(0))
    });
    p.assert_ok();
    p.assert_both_contain("success");
    // "  remote: LID 0000, QPN RECV 000011 SEND 000012, PSN .., SRQN 000001, GID .."
    let srqn = |out: &str| -> u32 {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with("remote:"))
            .expect("a remote line");
        let at = line.find("SRQN ").expect("an SRQN") + 5;
        u32::from_str_radix(&line[at..at + 6], 16).expect("a hex SRQN")
    };
    let (to_server, to_client) = (srqn(&p.client.stdout), srqn(&p.server.stdout));
    for (file, peer_srqn) in [(&files[0], to_client), (&files[1], to_server)] {
        let (requests, responses) = xrc_packets(file, peer_srqn);
        assert!(
            requests >= 20 * 10 && responses > 0,
            "{}: {requests} XRC requests, {responses} XRC responses\n{p:?}",
            file.display()
        );
    }
    match roce_check() {
        Some(tool) => {
            let problems = check_captures(&tool, &files);
            assert!(problems.is_empty(), "{}\n{p:?}", problems.join("\n"));
        }
        None => eprintln!("SKIPPED roce-check: ../shared/tools/roce-check not found"),
    }
}

/// In a capture of what one side sent: its XRC requests (each must carry
/// an XRCETH naming `srqn`) and XRC responses; any RoCE packet of another
/// transport fails.
fn xrc_packets(path: &Path, srqn: u32) -> (usize, usize) {
    use roxe_wire::frame::Datagram;
    use roxe_wire::pcap::{self, L3};
    use roxe_wire::{Packet, Transport};
    let file = std::fs::File::open(path).expect("open the capture");
    let reader = pcap::CaptureReader::new(std::io::BufReader::new(file)).expect("a pcap file");
    let (mut requests, mut responses) = (0, 0);
    for rec in reader {
        let rec = rec.expect("a pcap record");
        let Some(L3::Ipv4(ip) | L3::Ipv6(ip)) = pcap::link_payload(rec.link, &rec.data) else {
            continue;
        };
        let dg = Datagram::parse(ip).expect("a UDP datagram");
        let pkt = Packet::new_checked(dg.payload).expect("a RoCE packet");
        let op = pkt.opcode();
        assert_eq!(op.transport(), Transport::Xrc, "{op} in {}", path.display());
        if op.is_response() {
            assert_eq!(pkt.xrc_srqn(), None, "{op}");
            responses += 1;
        } else {
            assert_eq!(pkt.xrc_srqn(), Some(srqn), "{op} in {}", path.display());
            requests += 1;
        }
    }
    (requests, responses)
}
