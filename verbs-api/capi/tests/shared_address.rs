//! Many processes on one address, as on a host with rxe: unmodified
//! programs over the drop-in, every server and client of a test on the
//! same device address (`ROXE_ADDR`), so that the kernel must steer each
//! packet to the process that owns its QPN (or, for rdma_cm, its service
//! ID and communication ID). Each test leases its addresses and ports
//! ([`common::Net`]).

mod common;

use common::{run_one, run_pair, run_pair_cm, Net, Pair, Side, CM_ATTEMPTS};
use std::time::Duration;

/// Both exit 0 and report `iters` exchanges with no invalid data.
fn check_pingpong(p: &Pair, iters: u64) {
    p.assert_ok();
    p.assert_both_contain(&format!("\n{iters} iters in "));
    for r in [&p.server, &p.client] {
        assert!(!r.stdout.contains("invalid data"), "invalid data:\n{p:?}");
    }
}

#[test]
fn rc_pingpong_server_and_client_on_one_address() {
    if !common::programs_installed("rc_pingpong_server_and_client_on_one_address") {
        return;
    }
    let net = Net::new();
    let addr = net.server(0);
    // By GID, with the buffer checked; then by LID (both sides have the
    // same one: the address's).
    for (i, flags) in [(0u16, &["-g", "0", "-c"][..]), (1, &[][..])] {
        let port = net.port(i).to_string();
        let mut args = vec!["-d", "roxe0", "-p", &port, "-n", "200"];
        args.extend_from_slice(flags);
        let server = Side::new("ibv_rc_pingpong", &addr, &args);
        let client = Side::new("ibv_rc_pingpong", &addr, &args).arg(&addr);
        let p = run_pair(&server, &client, net.port(i));
        check_pingpong(&p, 200);
    }
}

#[test]
fn ud_pingpong_on_one_address() {
    if !common::programs_installed("ud_pingpong_on_one_address") {
        return;
    }
    let net = Net::new();
    let port = net.port(0).to_string();
    let args = [
        "-d", "roxe0", "-g", "0", "-p", &port, "-n", "200", "-s", "2048",
    ];
    let server = Side::new("ibv_ud_pingpong", &net.server(0), &args);
    let client = Side::new("ibv_ud_pingpong", &net.server(0), &args).arg(net.server(0));
    check_pingpong(&run_pair(&server, &client, net.port(0)), 200);
}

/// perftest's bandwidth and latency programs at once: every server on
/// one address, every client on another, all running together.
#[test]
fn perftest_pairs_at_once_on_shared_addresses() {
    if !common::programs_installed("perftest_pairs_at_once_on_shared_addresses") {
        return;
    }
    let net = Net::new();
    let (servers, clients) = (net.server(0), net.client(0));
    let runs: [(&str, &[&str]); 4] = [
        ("ib_write_bw", &["-s", "65536", "-n", "2000"]),
        ("ib_send_bw", &["-s", "65536", "-n", "2000"]),
        ("ib_read_bw", &["-s", "65536", "-n", "1000"]),
        ("ib_send_lat", &["-s", "64", "-n", "2000"]),
    ];
    let pairs: Vec<Pair> = std::thread::scope(|scope| {
        let handles: Vec<_> = runs
            .iter()
            .enumerate()
            .map(|(i, (tool, flags))| {
                let port = net.port(i as u16);
                let (servers, clients) = (&servers, &clients);
                scope.spawn(move || {
                    let p = port.to_string();
                    let mut args = vec!["-d", "roxe0", "-x", "0", "-p", &p];
                    args.extend_from_slice(flags);
                    let server = Side::new(tool, servers, &args);
                    let client = Side::new(tool, clients, &args).arg(servers);
                    run_pair(&server, &client, port)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((tool, _), p) in runs.iter().zip(&pairs) {
        p.assert_ok();
        assert!(
            p.client.stdout.contains("#bytes"),
            "{tool}: no result table\n{p:?}"
        );
    }
}

/// rping: two servers on two ports of one address, their clients on the
/// same address, all at once.
#[test]
fn rping_servers_on_two_ports_of_one_address() {
    if !common::programs_installed("rping_servers_on_two_ports_of_one_address") {
        return;
    }
    let net = Net::new();
    let addr = net.server(0);
    let pairs: Vec<Pair> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2u16)
            .map(|i| {
                let (addr, port) = (&addr, net.port(i).to_string());
                scope.spawn(move || {
                    let server = Side::new(
                        "rping",
                        addr,
                        &["-s", "-a", addr, "-p", &port, "-C", "500", "-V"],
                    );
                    let client = Side::new(
                        "rping",
                        addr,
                        &["-c", "-a", addr, "-p", &port, "-C", "500", "-V", "-v"],
                    );
                    run_pair_cm(&server, &client, Duration::ZERO, CM_ATTEMPTS)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for p in &pairs {
        p.assert_ok();
        let pings = p.client.stdout.matches("ping data: rdma-ping-").count();
        assert_eq!(pings, 500, "client pings\n{p:?}");
    }
}

/// A second process listening on a port of the address another process
/// listens on fails with EADDRINUSE, as over the kernel's rdma_cm.
#[test]
fn a_port_listened_on_by_another_process_is_in_use() {
    if !common::programs_installed("a_port_listened_on_by_another_process_is_in_use") {
        return;
    }
    let net = Net::new();
    let addr = net.server(0);
    let port = net.port(0).to_string();
    let listen = |secs: &str| {
        Side::new(
            "timeout",
            &addr,
            &[secs, "rping", "-s", "-a", &addr, "-p", &port, "-C", "1"],
        )
    };
    std::thread::scope(|scope| {
        // Holds the port (waiting for a client that never comes).
        let holder = scope.spawn(|| run_one(&listen("8")));
        // Until the holder listens: its service ID is in the address's
        // registry (`/tmp/roxe-<uid>/shared`, docs/ARCHITECTURE.md).
        let listening = || {
            // SAFETY: getuid has no preconditions.
            let dir = format!("/tmp/roxe-{}/shared", unsafe { libc::getuid() });
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with(&format!("{addr}-"))
                        && name.ends_with(".registry")
                        && std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains("\nservice "))
                })
        };
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !listening() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(listening(), "the first listener never listened");
        let taken = run_one(&listen("4"));
        assert!(
            taken
                .status
                .and_then(|s| s.code())
                .is_some_and(|c| c != 0 && c != 124),
            "a second listener on one port did not fail at once\n{taken:?}"
        );
        assert!(
            taken.stderr.contains("Address already in use")
                || taken.stdout.contains("Address already in use"),
            "{taken:?}"
        );
        let held = holder.join().unwrap();
        assert_eq!(
            held.status.and_then(|s| s.code()),
            Some(124),
            "the first listener waited until its timeout\n{held:?}"
        );
    });
}

/// UD through SIDR: udaddy's server and client on one address.
#[test]
fn udaddy_on_one_address() {
    if !common::programs_installed("udaddy_on_one_address") {
        return;
    }
    let net = Net::new();
    let addr = net.server(0);
    // udaddy's rdma_cm port is fixed (7174): the leased address is the
    // test's own.
    let server = Side::new("udaddy", &addr, &["-b", &addr]);
    let client = Side::new("udaddy", &addr, &["-s", &addr, "-b", &addr]);
    let p = run_pair_cm(&server, &client, Duration::ZERO, CM_ATTEMPTS);
    p.assert_ok();
    p.assert_both_contain("test complete");
}
