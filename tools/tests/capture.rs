//! `roxe capture -i lo` as a user runs it, in a user+network namespace of
//! its own (root there gives the packet socket CAP_NET_RAW; its `lo` sees
//! only this test's traffic): a capture of a `roxe demo` verifies every
//! packet and exits 0, and its `-w` file passes roce-check; hostile
//! traffic (random datagrams, a forged ICRC) makes it exit 1 and name what
//! was wrong. Skipped, with a message, without `unshare`, `ip`, `python3`.

use std::path::Path;
use std::process::{Command, Output};

fn have(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn usable() -> bool {
    let ok = have("unshare", &["-rn", "true"]) && have("ip", &["-V"]) && have("python3", &["-V"]);
    if !ok {
        println!("skipped: needs unshare (user+net namespaces), ip and python3");
    }
    ok
}

/// Run `script` in a fresh namespace with lo up; ROXE is the binary.
fn in_namespace(script: &str) -> Output {
    Command::new("unshare")
        .args(["-rn", "sh", "-c", &format!("ip link set lo up && {script}")])
        .env("ROXE", env!("CARGO_BIN_EXE_roxe"))
        .env_remove("ROXE_ADDR")
        .env_remove("ROXE_FAULT")
        .env_remove("ROXE_PCAP")
        .env_remove("ROXE_GSO")
        .output()
        .expect("run unshare")
}

/// `../shared/tools/roce-check --strict` must pass `pcap` (when present;
/// see `roxe_testnet::roce_check`).
fn roce_check_strict(pcap: &Path) {
    let roce_check = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tools/roce-check");
    if roce_check.is_file() {
        if let Err(report) = roxe_testnet::roce_check::strict(&roce_check, pcap) {
            panic!("{report}");
        }
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_capture_of_roxe_verifies_and_writes_a_pcap() {
    if !usable() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("roxe-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("live.pcap");
    let o = in_namespace(&format!(
        "\"$ROXE\" capture -i lo -c 200 --timeout 30 -w {} > {}/out.txt 2>&1 & \
         sleep 0.5; \"$ROXE\" demo -n 2 > /dev/null 2>&1; wait $!; echo capture-exit=$?; \
         cat {}/out.txt",
        pcap.display(),
        dir.display(),
        dir.display()
    ));
    let t = text(&o);
    assert!(t.contains("capture-exit=0"), "{t}");
    // -c counts captured frames; a GSO send (roxe's default) is one frame
    // of several packets, so there may be a few more than 200.
    let packets: u64 = t
        .split("RoCEv2 packets: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(packets >= 200, "{t}");
    assert!(t.contains("icrc=OK") && !t.contains("icrc=BAD"), "{t}");
    assert!(t.contains("result: PASS"), "{t}");
    roce_check_strict(&pcap);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hostile_traffic_fails_the_capture_and_is_named() {
    if !usable() {
        return;
    }
    // A well-formed BTH (RC SEND ONLY to QP 0x11) with a wrong ICRC, and
    // random bytes that are no RoCEv2 packet at all, both to port 4791.
    // (The namespace's lo is the test's alone; the address is leased all
    // the same, as every test's is.)
    let to = roxe_testnet::addr();
    let o = in_namespace(&format!(
        "\"$ROXE\" capture -i lo -c 2 --timeout 20 > /tmp/roxe-capture-hostile.$$ 2>&1 & \
         sleep 0.5; python3 -c '\
import socket, random\n\
random.seed(7)\n\
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
bth = bytes([0x04, 0x40, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 1])\n\
s.sendto(bth + bytes(16) + b\"\\xde\\xad\\xbe\\xef\", (\"{to}\", 4791))\n\
s.sendto(bytes(random.getrandbits(8) for _ in range(5)), (\"{to}\", 4791))\n\
'; wait $!; echo capture-exit=$?; cat /tmp/roxe-capture-hostile.$$; rm -f /tmp/roxe-capture-hostile.$$",
    ));
    let t = text(&o);
    assert!(t.contains("capture-exit=1"), "{t}");
    assert!(t.contains("icrc=BAD"), "the forged ICRC is not named:\n{t}");
    assert!(t.contains("result: FAIL"), "{t}");
    assert!(
        t.contains("malformed: 1") || t.contains("truncated"),
        "the random datagram is not reported:\n{t}"
    );
}

/// UDP GSO sends are wire-exact: every segment the kernel cuts from a GSO
/// send carries the ICRC of the IPv4 identification it gets (0, 1, 2, ...).
/// Two `roxe perf` processes exchange 64 KiB WRITEs with `ROXE_GSO=on`
/// (and `ROXE_ICRC=strict` receivers, which check each GRO segment); the
/// capture on lo cuts each GSO send as the kernel will and verifies every
/// segment, and its pcap passes roce-check --strict.
#[test]
fn gso_segments_carry_the_icrc_of_their_identification() {
    if !usable() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("roxe-capture-gso-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("gso.pcap");
    let [server, client] = roxe_testnet::addrs();
    let (port, host) = (roxe_testnet::port(), roxe_testnet::CONTROL_HOST);
    let o = in_namespace(&format!(
        "\"$ROXE\" capture -i lo -c 3000 --timeout 30 -w {pcap} > {d}/out.txt 2>&1 & \
         sleep 0.5; \
         ROXE_GSO=on ROXE_ICRC=strict ROXE_ADDR={server} \"$ROXE\" perf write -s 65536 -n 40 -p {port} --timeout 20 > {d}/server.txt 2>&1 & \
         sleep 0.3; \
         ROXE_GSO=on ROXE_ICRC=strict ROXE_ADDR={client} \"$ROXE\" perf write -s 65536 -n 40 -p {port} --timeout 20 --json client {host} > {d}/client.txt 2>&1; \
         echo client-exit=$?; wait %2; echo server-exit=$?; kill -INT %1; wait %1; \
         cat {d}/out.txt {d}/client.txt",
        pcap = pcap.display(),
        d = dir.display(),
    ));
    let t = text(&o);
    assert!(
        t.contains("client-exit=0") && t.contains("server-exit=0"),
        "{t}"
    );
    assert!(t.contains("icrc=OK") && !t.contains("icrc=BAD"), "{t}");
    assert!(t.contains("result: PASS"), "{t}");
    roce_check_strict(&pcap);
    let _ = std::fs::remove_dir_all(&dir);
}
