//! `roxe stat` as a user runs it: the devices and QPs of other running
//! processes (two `roxe pingpong`s), in state RTS, as JSON and a table;
//! once they are gone, their sockets are cleaned away. Each run uses its
//! own `XDG_RUNTIME_DIR`, so parallel tests do not see each other.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn roxe(xdg: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_roxe"));
    c.env("XDG_RUNTIME_DIR", xdg)
        .env_remove("ROXE_FAULT")
        .env_remove("ROXE_PCAP");
    c
}

fn pingpong(xdg: &Path, addr: &str, port: u16, server: Option<&str>) -> Child {
    let mut c = roxe(xdg);
    c.args(["pingpong", "-g", "0", "-n", "2000000", "-s", "64", "-p"])
        .arg(port.to_string())
        .env("ROXE_ADDR", addr)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(s) = server {
        c.arg(s);
    }
    c.spawn().expect("spawn roxe pingpong")
}

fn stat_json(xdg: &Path) -> serde_json::Value {
    let o = roxe(xdg)
        .args(["stat", "--json"])
        .output()
        .expect("run roxe stat");
    assert!(o.status.success(), "{o:?}");
    serde_json::from_slice(&o.stdout).expect("roxe stat --json prints JSON")
}

fn rts_qps(v: &serde_json::Value, addr: &str) -> usize {
    v["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["addr"] == addr)
        .flat_map(|d| d["qps"].as_array().into_iter().flatten())
        .filter(|q| q["state"] == "RTS" && q["type"] == "RC")
        .count()
}

#[test]
fn stat_shows_the_qps_of_running_processes_and_forgets_dead_ones() {
    let xdg = std::env::temp_dir().join(format!("roxe-stat-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&xdg);
    std::fs::create_dir_all(&xdg).unwrap();
    let [a, b] = roxe_testnet::addrs().map(|a| a.to_string());
    let port = roxe_testnet::port();
    let mut server = pingpong(&xdg, &a, port, None);
    std::thread::sleep(Duration::from_millis(300));
    let mut client = pingpong(&xdg, &b, port, Some(roxe_testnet::CONTROL_HOST));
    let end = Instant::now() + Duration::from_secs(20);
    let mut last = serde_json::Value::Null;
    while Instant::now() < end {
        last = stat_json(&xdg);
        if rts_qps(&last, &a) == 1 && rts_qps(&last, &b) == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let table = roxe(&xdg).arg("stat").output().unwrap();
    let _ = server.kill();
    let _ = client.kill();
    let _ = server.wait();
    let _ = client.wait();
    assert_eq!(rts_qps(&last, &a), 1, "{last:#}");
    assert_eq!(rts_qps(&last, &b), 1, "{last:#}");
    let dev = last["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["addr"] == b.as_str())
        .unwrap();
    assert!(dev["tx_packets"].as_u64().unwrap() > 0, "{dev:#}");
    assert_eq!(dev["qps"][0]["peer"], a.as_str(), "{dev:#}");
    // Drops by reason, per device and per QP (none on a clean run).
    assert!(dev["drops"].is_object(), "{dev:#}");
    // The CM's counters, refusals by reason (none here: no CM traffic).
    assert!(dev["cm"]["rx_mads"].is_u64(), "{dev:#}");
    assert!(dev["cm"]["refused"].is_object(), "{dev:#}");
    assert!(dev["qps"][0]["drops"].is_object(), "{dev:#}");
    // Per-QP traffic and the CQs.
    assert!(dev["qps"][0]["tx_packets"].as_u64().unwrap() > 0, "{dev:#}");
    assert!(dev["qps"][0]["rx_packets"].as_u64().unwrap() > 0, "{dev:#}");
    assert!(dev["qps"][0]["tx_retransmits"].is_u64(), "{dev:#}");
    let cqs = dev["cqs"].as_array().unwrap();
    assert!(!cqs.is_empty(), "{dev:#}");
    assert!(cqs.iter().all(|c| c["overflowed"] == false), "{dev:#}");
    assert!(cqs.iter().any(|c| c["qps"] == 1), "{dev:#}");
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains(&format!("{a} (pid")) && table.contains("RTS"),
        "{table}"
    );

    // Killed without closing their devices: their sockets stay until the
    // next `roxe stat`, which removes them and lists nothing.
    let after = stat_json(&xdg);
    assert_eq!(
        after["devices"].as_array().map(Vec::len),
        Some(0),
        "{after:#}"
    );
    // The shared addresses' registries stay (they remember when each slot
    // was freed); sockets do not.
    let left: Vec<_> = std::fs::read_dir(xdg.join("roxe"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name() != "shared")
        .collect();
    assert!(left.is_empty(), "stale sockets left: {left:?}");
    let _ = std::fs::remove_dir_all(&xdg);
}
