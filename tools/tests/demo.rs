//! `roxe demo` as a user runs it: two processes on loopback, every
//! operation verified, exit 0; its capture (ROXE_PCAP on the server, which
//! sees both directions) passes the independent checker
//! ../shared/tools/roce-check --strict and `roxe decode`: no bad ICRC, no
//! malformed packet, no PSN gap.

use std::process::Command;

#[test]
fn demo_passes_and_its_capture_is_clean() {
    let pcap = std::env::temp_dir().join(format!("roxe-demo-test-{}.pcap", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_roxe"))
        .args(["demo", "-n", "8", "--pcap"])
        .arg(&pcap)
        .env_remove("ROXE_ADDR")
        .env_remove("ROXE_FAULT")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "roxe demo failed");
    for op in [
        "SEND ",
        "SEND_WITH_IMM",
        "RDMA_WRITE ",
        "RDMA_WRITE_WITH_IMM",
        "RDMA_READ",
        "ATOMIC_FETCH_ADD",
        "ATOMIC_CMP_SWP",
        "UD_SEND",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(op))
            .unwrap_or_else(|| panic!("no row for {op}"));
        assert!(line.trim_end().ends_with("ok"), "{line}");
    }

    let decode = Command::new(env!("CARGO_BIN_EXE_roxe"))
        .arg("decode")
        .arg(&pcap)
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&decode.stdout);
    assert!(decode.status.success(), "roxe decode: {summary}");
    assert!(summary.contains(" 0 bad"), "{summary}");

    if let Some(rc) = roxe_testnet::roce_check::tool() {
        match roxe_testnet::roce_check::strict(&rc, &pcap) {
            Ok(text) => println!(
                "{}",
                text.lines().rev().take(6).collect::<Vec<_>>().join("\n")
            ),
            Err(text) => panic!("roce-check --strict failed:\n{text}"),
        }
    }
    let _ = std::fs::remove_file(&pcap);
}

/// `ROXE_PCAP` works for `roxe demo` as for any roxe program: the server
/// (which sees both directions) writes the capture.
#[test]
fn demo_honours_roxe_pcap() {
    let pcap = std::env::temp_dir().join(format!("roxe-demo-env-{}.pcap", std::process::id()));
    let _ = std::fs::remove_file(&pcap);
    let out = Command::new(env!("CARGO_BIN_EXE_roxe"))
        .args(["demo", "-n", "2"])
        .env("ROXE_PCAP", &pcap)
        .env_remove("ROXE_ADDR")
        .env_remove("ROXE_FAULT")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "roxe demo failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let decode = Command::new(env!("CARGO_BIN_EXE_roxe"))
        .arg("decode")
        .arg(&pcap)
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&decode.stdout);
    assert!(decode.status.success(), "roxe decode {pcap:?}: {summary}");
    assert!(summary.contains("RC_RDMA_WRITE"), "{summary}");
    assert!(summary.contains("UD_SEND_ONLY"), "{summary}");
    let _ = std::fs::remove_file(&pcap);
}

/// `ROXE_LOG=debug` on a demo under injected loss shows the QPs reaching
/// RTS and the transport recovering (timeouts or go-back-N), on stderr.
#[test]
fn roxe_log_shows_qp_states_and_retransmissions() {
    let out = Command::new(env!("CARGO_BIN_EXE_roxe"))
        .args(["demo", "-n", "2"])
        .env("ROXE_LOG", "debug")
        .env("ROXE_FAULT", "loss=0.05,seed=3")
        .env_remove("ROXE_ADDR")
        .env_remove("ROXE_PCAP")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "roxe demo failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr.lines().rev().take(20).collect::<Vec<_>>().join("\n")
    );
    let has = |what: &str| stderr.lines().any(|l| l.contains(what));
    assert!(has("device open"), "no device line");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("QP state change") && l.contains("to=RTS")),
        "no QP reached RTS in the log"
    );
    assert!(
        has("go-back-N") || has("retransmission timeout"),
        "no recovery logged under 5 % loss"
    );
}
