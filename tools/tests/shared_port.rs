//! Soft devices beside the kernel's rxe, which holds `0.0.0.0:4791` once
//! an rxe link exists: `roxe demo` (two processes, every RC operation and
//! a UD echo) in a network namespace of its own where another socket holds
//! that wildcard port, as rxe's kernel socket would. The devices share the
//! port (a claim on port 47910 to send from, a raw socket to receive), and
//! the capture passes roce-check (the ICRC covers the new source port).
//!
//! Needs `unshare` (user and network namespaces: root in them gives the
//! raw socket its CAP_NET_RAW), `ip` and `python3`; skipped, with a
//! message, where any is missing or namespaces are not allowed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn have(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn roce_check() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tools/roce-check");
    p.is_file().then_some(p)
}

#[test]
fn soft_devices_share_port_4791_with_a_wildcard_holder() {
    if !have("unshare", &["-rn", "true"]) || !have("ip", &["-V"]) || !have("python3", &["-V"]) {
        println!("skipped: needs unshare (user+net namespaces), ip and python3");
        return;
    }
    let dir = std::env::temp_dir().join(format!("roxe-shared-port-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("demo.pcap");
    let script = format!(
        "ip link set lo up && \
         python3 -c 'import socket, time; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
         s.bind((\"0.0.0.0\", 4791)); time.sleep(120)' & \
         for i in $(seq 50); do grep -q ' 00000000:12B7 ' /proc/net/udp && break; sleep 0.1; done; \
         ROXE_LOG=info timeout 100 {} demo --pcap {}; rc=$?; kill $! 2>/dev/null; exit $rc",
        env!("CARGO_BIN_EXE_roxe"),
        pcap.display()
    );
    let out = Command::new("unshare")
        .args(["-rn", "sh", "-c", &script])
        .env_remove("ROXE_ADDR")
        .env_remove("ROXE_FAULT")
        .output()
        .expect("run unshare");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "roxe demo in the namespace failed:\n{text}"
    );
    assert!(
        text.contains("port 4791 held by the kernel's rxe: sharing it"),
        "the devices did not share the port:\n{text}"
    );
    assert!(text.contains("UD_SEND (echo)"), "{text}");
    // Each device reaches the other at its claim port, through a UDP
    // socket with GRO, instead of through its raw socket.
    assert!(
        text.matches("reached at its claim port").count() >= 2,
        "the devices did not reach each other directly:\n{text}"
    );
    match roce_check() {
        Some(tool) => {
            // Not --strict: raw receive drops bursts here, and a
            // go-back-N that resumes inside a WRITE makes the checker warn
            // about the message's length (as rxe's do); errors still fail.
            let rc = Command::new("python3")
                .arg(&tool)
                .args(["-q"])
                .arg(&pcap)
                .output()
                .expect("run roce-check");
            assert!(
                rc.status.success(),
                "roce-check {}:\n{}",
                pcap.display(),
                String::from_utf8_lossy(&rc.stdout)
            );
        }
        None => println!("roce-check not found: capture not checked"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
