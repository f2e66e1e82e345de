//! Processes come and go on a shared address: a process killed in the
//! middle of a stream leaves its QPNs to nobody (their packets reach
//! another process of the address, which drops and counts them), the
//! others' streams go on, and the next process takes another slot of the
//! QPN space. Each test leases its addresses and ports and uses its own
//! `XDG_RUNTIME_DIR` for `roxe stat`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROXE: &str = env!("CARGO_BIN_EXE_roxe");

fn roxe(xdg: &Path, addr: &str) -> Command {
    let mut c = Command::new(ROXE);
    c.env("XDG_RUNTIME_DIR", xdg)
        .env("ROXE_ADDR", addr)
        .env_remove("ROXE_FAULT")
        .env_remove("ROXE_PCAP")
        .stdin(Stdio::null());
    c
}

fn perf(xdg: &Path, addr: &str, port: u16, secs: u32, server: Option<&str>) -> Child {
    let mut c = roxe(xdg, addr);
    c.args(["perf", "write", "-s", "65536", "-D"])
        .arg(secs.to_string())
        .arg("-p")
        .arg(port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match server {
        Some(s) => c.args(["client", s]),
        None => c.arg("server"),
    };
    c.spawn().expect("spawn roxe perf")
}

/// The QPNs of the process `pid`'s devices at `addr`.
fn qpns_of(xdg: &Path, addr: &str, pid: u64) -> Vec<u32> {
    let o = roxe(xdg, addr).args(["stat", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("roxe stat --json");
    v["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["addr"] == addr && d["pid"].as_u64() == Some(pid))
        .flat_map(|d| d["qps"].as_array().cloned().unwrap_or_default())
        .filter_map(|q| q["qpn"].as_u64().map(|n| n as u32))
        .collect()
}

/// (pid, slot, misrouted) of every device open at `addr`.
fn devices_at(xdg: &Path, addr: &str) -> Vec<(u64, u64, u64)> {
    let o = roxe(xdg, addr).args(["stat", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("roxe stat --json");
    v["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["addr"] == addr)
        .map(|d| {
            let n = |k: &str| d[k].as_u64().unwrap_or(0);
            (n("pid"), n("slot"), n("rx_misrouted"))
        })
        .collect()
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn finish(mut c: Child, limit: Duration) -> std::process::Output {
    let end = Instant::now() + limit;
    while c.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = c.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    c.wait_with_output().unwrap()
}

#[test]
fn a_killed_process_leaves_its_qpns_to_nobody() {
    let xdg = std::env::temp_dir().join(format!("roxe-shared-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&xdg);
    std::fs::create_dir_all(&xdg).unwrap();
    let [x, y] = roxe_testnet::addrs().map(|a| a.to_string());
    let [p1, p2] = [roxe_testnet::port(), roxe_testnet::port()];
    // Two servers on x, their clients on y (a server opens its device
    // once its client connects).
    let victim = perf(&xdg, &x, p2, 30, None);
    let survivor = perf(&xdg, &x, p1, 6, None);
    std::thread::sleep(Duration::from_millis(500));
    let victim_client = perf(&xdg, &y, p2, 30, Some(&x));
    let survivor_client = perf(&xdg, &y, p1, 6, Some(&x));
    wait_for("two devices on x", Duration::from_secs(20), || {
        devices_at(&xdg, &x).len() == 2
    });
    std::thread::sleep(Duration::from_millis(1000));
    let on_x = devices_at(&xdg, &x);
    let victim_slot = on_x
        .iter()
        .find(|d| d.0 == u64::from(victim.id()))
        .map(|d| d.1)
        .expect("the victim's device");
    let survivor_pid = u64::from(survivor.id());
    assert!(
        on_x.iter().all(|d| d.1 != 0),
        "shared devices have slots: {on_x:?}"
    );
    let victim_qpns = qpns_of(&xdg, &x, u64::from(victim.id()));
    assert!(!victim_qpns.is_empty(), "the victim's QPs");
    // SAFETY: kill(2) on a child this test started and has not reaped.
    unsafe { libc::kill(victim.id() as i32, libc::SIGKILL) };
    let victim = finish(victim, Duration::from_secs(5));
    assert!(!victim.status.success());
    // A peer still sending to the victim's QPNs (as its client may, until
    // it gives up): RC SENDs from another address. They reach the
    // survivor, the only process left on x, which drops them.
    let peer = std::net::UdpSocket::bind((roxe_testnet::addr(), 0)).unwrap();
    let misrouted = || {
        devices_at(&xdg, &x)
            .iter()
            .find(|d| d.0 == survivor_pid)
            .map_or(0, |d| d.2)
    };
    let before = misrouted();
    let sent = 20 * victim_qpns.len() as u64;
    for &qpn in &victim_qpns {
        let mut p = [0u8; 12 + 64 + 4];
        p[0] = 0x04; // RC SEND only
        p[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
        p[4..8].copy_from_slice(&qpn.to_be_bytes());
        for _ in 0..20 {
            peer.send_to(&p, (x.as_str(), 4791)).unwrap();
        }
    }
    wait_for(
        "packets to the victim's QPNs dropped by the survivor",
        Duration::from_secs(10),
        || misrouted() >= before + sent,
    );
    let s = finish(survivor, Duration::from_secs(30));
    let c = finish(survivor_client, Duration::from_secs(30));
    let text = |o: &std::process::Output| {
        format!(
            "{}\n{}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(
        s.status.success() && c.status.success(),
        "the survivor's stream:\n{}\n{}",
        text(&s),
        text(&c)
    );
    assert!(text(&c).contains("BW average"), "{}", text(&c));
    let _ = finish(victim_client, Duration::from_secs(20));
    // The next process on x takes a slot the victim did not have.
    let p3 = roxe_testnet::port();
    let next = perf(&xdg, &x, p3, 3, None);
    std::thread::sleep(Duration::from_millis(300));
    let next_client = perf(&xdg, &y, p3, 3, Some(&x));
    wait_for("the next device on x", Duration::from_secs(20), || {
        devices_at(&xdg, &x)
            .iter()
            .any(|d| d.0 == u64::from(next.id()))
    });
    let next_slot = devices_at(&xdg, &x)
        .iter()
        .find(|d| d.0 == u64::from(next.id()))
        .map(|d| d.1)
        .unwrap();
    assert_ne!(
        next_slot, victim_slot,
        "a killed process's slot was taken at once"
    );
    let (n, nc) = (
        finish(next, Duration::from_secs(20)),
        finish(next_client, Duration::from_secs(20)),
    );
    assert!(
        n.status.success() && nc.status.success(),
        "{}\n{}",
        text(&n),
        text(&nc)
    );
    let _ = std::fs::remove_dir_all(&xdg);
}

/// Another user's process cannot join an address this user's processes
/// share: the kernel keeps a reuseport group to one user, and the registry
/// is per user. It fails as a second process did before addresses were
/// shared, with EADDRINUSE and a line that says why.
#[test]
fn another_user_cannot_join_a_shared_address() {
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    let setpriv = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|d| d.join("setpriv").is_file());
    if !root || !setpriv {
        eprintln!("not root or no setpriv: this test runs as nobody from root");
        return;
    }
    let as_nobody = |addr: &str| {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                ROXE,
                "devinfo",
            ])
            .env("ROXE_ADDR", addr)
            .env("XDG_RUNTIME_DIR", "")
            .env("HOME", "/tmp")
            .output()
            .unwrap()
    };
    let probe = as_nobody(&roxe_testnet::addr().to_string());
    if !probe.status.success() {
        eprintln!(
            "nobody cannot open a device here (a private directory on the binary's path?): skipped\n{}",
            String::from_utf8_lossy(&probe.stderr)
        );
        return;
    }
    let xdg = std::env::temp_dir().join(format!("roxe-shared-user-{}", std::process::id()));
    std::fs::create_dir_all(&xdg).unwrap();
    let [x, y] = roxe_testnet::addrs().map(|a| a.to_string());
    let p = roxe_testnet::port();
    let server = perf(&xdg, &x, p, 4, None);
    std::thread::sleep(Duration::from_millis(300));
    let client = perf(&xdg, &y, p, 4, Some(&x));
    wait_for("the device on x", Duration::from_secs(20), || {
        !devices_at(&xdg, &x).is_empty()
    });
    let o = as_nobody(&x);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "nobody joined root's address:\n{err}");
    assert!(
        err.contains("Address already in use") && err.contains("another user"),
        "{err}"
    );
    let (s, c) = (
        finish(server, Duration::from_secs(30)),
        finish(client, Duration::from_secs(30)),
    );
    assert!(s.status.success() && c.status.success());
    let _ = std::fs::remove_dir_all(&xdg);
}
