//! `roxe decode` as a user runs it: exit statuses, output, JSON, and
//! agreement with the independent checker ../shared/tools/roce-check.

use roxe_wire::cm::{self, reason, CmMad, CmMessage, RejRepr};
use roxe_wire::frame::{build_datagram, IpFields};
use roxe_wire::pcap::PcapWriter;
use roxe_wire::{AethRepr, AethSyndrome, BthRepr, DethRepr, ExtHeaders, Opcode, PacketRepr, Psn};
use serde_json::Value;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn roxe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_roxe"))
        .args(args)
        .output()
        .unwrap()
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn golden(name: &str) -> String {
    root()
        .join("tests/data/golden")
        .join(name)
        .display()
        .to_string()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("roxe-decode-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn good_capture_prints_a_line_per_packet_and_passes() {
    let out = roxe(&["decode", &golden("rxe-rc_write_bw_s4096_pmtu512.pcap")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let lines: Vec<_> = text.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(lines.len(), 45, "{text}");
    assert!(
        lines[0].contains("RC_RDMA_WRITE_FIRST")
            && lines[0].contains("RETH(")
            && lines[0].contains("icrc=OK")
    );
    assert!(text.contains("RC_ACKNOWLEDGE") && text.contains("AETH(ACK credits=invalid"));
    assert!(text.contains("ICRC: 45 ok, 0 bad"), "{text}");
    assert!(text.contains("result: PASS"));
}

#[test]
fn corrupted_icrc_fails_and_is_reported() {
    let out = roxe(&["decode", &golden("rxe-host_probe_mad_ping.pcap")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("icrc=BAD") && text.contains("ICRC mismatch"),
        "{text}"
    );
    assert!(text.contains("ICRC: 2 ok, 1 bad"), "{text}");
}

#[test]
fn json_and_verbose_output() {
    let out = roxe(&[
        "decode",
        "--json",
        "-v",
        &golden("rxe-rc_atomic_cmp_swap.pcap"),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let v = json_of(&out);
    let f = &v["files"][0];
    assert_eq!(f["roce_packets"], 10);
    assert_eq!(f["icrc"]["ok"], 10);
    assert_eq!(f["opcodes"]["RC_COMPARE_SWAP"], 5);
    assert_eq!(f["packets"].as_array().unwrap().len(), 10);
    assert!(f["packets"][0]["headers"]["AtomicETH"].is_string());
    let out = roxe(&["decode", "-v", &golden("rxe-rc_atomic_cmp_swap.pcap")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("    BTH opcode=0x13") && text.contains("    ICRC wire="),
        "{text}"
    );
}

#[test]
fn cm_mads_are_named_with_their_ids() {
    let out = roxe(&["decode", &golden("rxe-rdmacm_rping_s64.pcap")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for name in [
        "CM ConnectRequest",
        "CM ConnectReply",
        "CM ReadyToUse",
        "CM DisconnectRequest",
        "CM DisconnectReply",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    let cm_lines: Vec<_> = text.lines().filter(|l| l.contains(" CM ")).collect();
    assert_eq!(cm_lines.len(), 5, "{text}");
    assert!(cm_lines
        .iter()
        .all(|l| l.contains("UD_SEND_ONLY qp=0x000001")));
    assert!(cm_lines[0].ends_with(
        " CM ConnectRequest(local_comm_id=0xe3ebdbd1 service_id=0x0000000001061c06 \
         qpn=0x00002b psn=0xb93b5a cma=10.47.91.12:53293>10.47.91.11)"
    ));
    assert!(cm_lines[1].ends_with(
        " CM ConnectReply(local_comm_id=0xd267a808 remote_comm_id=0xe3ebdbd1 \
         qpn=0x00002b psn=0xd5acfb)"
    ));
    assert!(cm_lines[3].ends_with(
        " CM DisconnectRequest(local_comm_id=0xe3ebdbd1 remote_comm_id=0xd267a808 \
         remote_qpn=0x00002b)"
    ));

    let out = roxe(&["decode", &golden("rxe-rdmacm_ud_udaddy_s64.pcap")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            " CM SIDR_REQ(request_id=0xe2ebdbd1 service_id=0x0000000001111c06 \
             cma=10.47.91.12:40033>10.47.91.11)"
        ),
        "{text}"
    );
    assert!(
        text.contains(" CM SIDR_REP(request_id=0xe2ebdbd1 status=0 qpn=0x00002c qkey=0x01234567)"),
        "{text}"
    );

    // JSON and -v carry it too.
    let out = roxe(&[
        "decode",
        "--json",
        "-v",
        &golden("rxe-rdmacm_rping_s64.pcap"),
    ]);
    let v = json_of(&out);
    let pkts = v["files"][0]["packets"].as_array().unwrap();
    assert!(pkts[0]["cm"]
        .as_str()
        .unwrap()
        .starts_with("ConnectRequest(local_comm_id=0xe3ebdbd1"));
    assert!(pkts[3].get("cm").is_none(), "an RC packet has no CM field");
    let out = roxe(&["decode", "-v", &golden("rxe-rdmacm_rping_s64.pcap")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("    MAD base=1 class=0x07 version=2 method=0x03 status=0x0000 tid=0x00000002d1dbebe3 attr=0x0010"),
        "{text}"
    );

    // A MAD of another class to QP1 (the host's PerfMgt probe) is no CM MAD.
    let out = roxe(&["decode", &golden("rxe-host_probe_mad_ping.pcap")]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains(" CM "));
}

#[test]
fn cm_reject_shows_its_reason() {
    let rej = CmMad::send(
        0x42,
        CmMessage::Rej(RejRepr {
            local_comm_id: 0x1111_2222,
            remote_comm_id: 0x3333_4444,
            msg_rejected: 0,
            reason: reason::INVALID_SERVICE_ID,
            ..RejRepr::default()
        }),
    )
    .unwrap();
    let mut mad = [0u8; cm::MAD_LEN];
    rej.emit(&mut mad).unwrap();
    let pkt = PacketRepr {
        bth: BthRepr {
            ack_req: true,
            ..BthRepr::new(Opcode::UdSendOnly, cm::GSI_QPN, Psn::new(9))
        },
        ext: ExtHeaders {
            deth: Some(DethRepr {
                qkey: cm::GSI_QKEY,
                src_qp: cm::GSI_QPN,
                reserved: 0,
            }),
            ..ExtHeaders::NONE
        },
        payload: &mad,
    };
    let a = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)); // testnet: allow (a packet written to a file)
    let b = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)); // testnet: allow (a packet written to a file)
    let mut buf = [0u8; 512];
    let n = build_datagram(&mut buf, a, b, 0xc001, 4791, IpFields::default(), &pkt).unwrap();
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    w.write_ip(1, &buf[..n]).unwrap();
    let path = tmp("rej.pcap");
    std::fs::write(&path, w.into_inner().unwrap()).unwrap();
    let out = roxe(&["decode", path.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(
            " CM ConnectReject(reason=8 InvalidServiceID local_comm_id=0x11112222 \
             remote_comm_id=0x33334444 msg_rejected=0)"
        ),
        "{text}"
    );
}

#[test]
fn unreadable_and_empty_captures() {
    let missing = tmp("missing.pcap");
    let out = roxe(&["decode", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.pcap"));
    let garbage = tmp("garbage.pcap");
    std::fs::write(&garbage, b"this is not a capture file").unwrap();
    assert_eq!(
        roxe(&["decode", garbage.to_str().unwrap()]).status.code(),
        Some(2)
    );
    let empty = tmp("empty.pcap");
    let w = PcapWriter::new(Vec::new()).unwrap();
    std::fs::write(&empty, w.into_inner().unwrap()).unwrap();
    assert_eq!(
        roxe(&["decode", empty.to_str().unwrap()]).status.code(),
        Some(3)
    );
    assert_eq!(
        roxe(&["decode"]).status.code(),
        Some(2),
        "missing FILE is a usage error"
    );
}

/// A capture with one packet of each kind of damage a sender can do, all
/// with correct ICRCs over the damaged bytes.
fn write_malformed_capture(path: &Path) {
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    let a = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)); // testnet: allow (a packet written to a file)
    let b = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)); // testnet: allow (a packet written to a file)
    let ack = PacketRepr {
        bth: BthRepr::new(Opcode::RcAcknowledge, 0x11, Psn::new(5)),
        ext: ExtHeaders {
            aeth: Some(AethRepr {
                syndrome: AethSyndrome::ACK,
                msn: 1,
            }),
            ..ExtHeaders::NONE
        },
        payload: &[],
    };
    let mut buf = [0u8; 256];
    let mut push = |w: &mut PcapWriter<Vec<u8>>, mutate: &dyn Fn(&mut [u8]), extra: usize| {
        let n = build_datagram(&mut buf, a, b, 0xc000, 4791, IpFields::default(), &ack).unwrap();
        let mut dg = buf[..n].to_vec();
        dg.splice(n - 4..n - 4, std::iter::repeat_n(0, extra));
        mutate(&mut dg);
        // Fix the lengths and the ICRC for what was changed.
        let total = dg.len() as u16;
        dg[2..4].copy_from_slice(&total.to_be_bytes());
        dg[10..12].fill(0);
        let c = !roxe_wire::ip::ones_complement_sum(&dg[..20], 0);
        dg[10..12].copy_from_slice(&c.to_be_bytes());
        dg[24..26].copy_from_slice(&(total - 20).to_be_bytes());
        let icrc = roxe_wire::icrc::compute(&dg[..20], &dg[20..28], &dg[28..dg.len() - 4]).unwrap();
        let l = dg.len();
        dg[l - 4..].copy_from_slice(&icrc.to_le_bytes());
        w.write_ip(1, &dg).unwrap();
    };
    push(&mut w, &|_| {}, 0); // good
    push(&mut w, &|d| d[29] |= 0x20, 0); // pad count 2 on an ACK
    push(&mut w, &|d| d[28] = 0x15, 0); // reserved opcode
    push(&mut w, &|d| d[29] |= 0x01, 0); // TVer 1
    push(&mut w, &|_| {}, 4); // ACK carrying payload
    push(&mut w, &|d| d[40] = 0x45, 0); // reserved NAK code 5
    std::fs::write(path, w.into_inner().unwrap()).unwrap();
}

#[test]
fn malformed_packets_fail_and_match_roce_check() {
    let path = tmp("malformed.pcap");
    write_malformed_capture(&path);
    let out = roxe(&["decode", "--json", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let f = json_of(&out)["files"][0].clone();
    assert_eq!(f["roce_packets"], 6);
    assert_eq!(f["icrc"]["ok"], 6);
    assert_eq!(f["malformed"], 5, "{f}");
    if let Some(rc) = roce_check() {
        assert_eq!(verdicts_of_roce_check(&rc, &path), verdicts_of_roxe(&path));
    }
}

/// (RoCEv2 packets, ICRC ok, ICRC bad, malformed, exit status).
type Verdicts = (u64, u64, u64, u64, i32);

fn verdicts_of_roxe(path: &Path) -> Verdicts {
    let out = roxe(&["decode", "--json", path.to_str().unwrap()]);
    let f = &json_of(&out)["files"][0];
    let n = |v: &Value| v.as_u64().unwrap_or(u64::MAX);
    (
        n(&f["roce_packets"]),
        n(&f["icrc"]["ok"]),
        n(&f["icrc"]["bad"]),
        n(&f["malformed"]),
        out.status.code().unwrap_or(-1),
    )
}

fn verdicts_of_roce_check(tool: &Path, path: &Path) -> Verdicts {
    let out = Command::new("python3")
        .arg(tool)
        .arg("--json")
        .arg(path)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = &v["files"][0];
    let n = |v: &Value| v.as_u64().unwrap_or(u64::MAX);
    let roce = f
        .get("roce_packets")
        .or_else(|| f.get("rocev2_packets"))
        .map(n)
        .unwrap_or(u64::MAX);
    (
        roce,
        n(&f["icrc"]["ok"]),
        n(&f["icrc"]["bad"]),
        n(&f["malformed"]),
        out.status.code().unwrap_or(-1),
    )
}

fn shared() -> Option<PathBuf> {
    let p = root().join("../shared");
    p.is_dir().then_some(p)
}

fn roce_check() -> Option<PathBuf> {
    let tool = shared()
        .map(|s| s.join("tools/roce-check"))
        .filter(|t| t.is_file());
    let python = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if tool.is_none() || !python {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI must have roce-check and python3"
        );
        eprintln!("SKIP: roce-check oracle not available");
        return None;
    }
    tool
}

#[test]
fn verdicts_agree_with_roce_check_on_every_golden_capture() {
    let Some(tool) = roce_check() else { return };
    let mut files: Vec<PathBuf> = Vec::new();
    let mut dirs = vec![root().join("tests/data/golden")];
    if let Some(s) = shared() {
        dirs.push(s.join("golden/public"));
        dirs.push(s.join("golden/rxe"));
    }
    for d in dirs {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "pcap") {
                files.push(e.path());
            }
        }
    }
    assert!(files.len() >= 20);
    for f in &files {
        assert_eq!(
            verdicts_of_roxe(f),
            verdicts_of_roce_check(&tool, f),
            "{}",
            f.display()
        );
    }
    eprintln!(
        "roxe decode and roce-check agree on {} captures",
        files.len()
    );
}

/// Requests of one RC flow with these PSNs, in this order, as a capture.
fn write_requests(path: &Path, psns: &[u32]) {
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    let a = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)); // testnet: allow (a packet written to a file)
    let b = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)); // testnet: allow (a packet written to a file)
    let payload = [0u8; 256]; // a MIDDLE packet carries a whole PMTU
    let mut buf = [0u8; 512];
    for &psn in psns {
        let pkt = PacketRepr {
            bth: BthRepr::new(Opcode::RcSendMiddle, 0x11, Psn::new(psn)),
            ext: ExtHeaders::NONE,
            payload: &payload,
        };
        let n = build_datagram(&mut buf, a, b, 0xc000, 4791, IpFields::default(), &pkt).unwrap();
        w.write_ip(1, &buf[..n]).unwrap();
    }
    std::fs::write(path, w.into_inner().unwrap()).unwrap();
}

#[test]
fn a_requester_that_skips_psns_is_warned_about_but_a_go_back_is_not() {
    // 100..=109 sent, a go-back to 103 overtaken by an ACK at 105, then
    // on with 110: every PSN was sent once in order.
    let legal = tmp("go-back.pcap");
    let mut psns: Vec<u32> = (100..110).chain(103..106).chain(110..112).collect();
    write_requests(&legal, &psns);
    let out = roxe(&["decode", "--json", legal.to_str().unwrap()]);
    let f = json_of(&out)["files"][0].clone();
    assert_eq!(out.status.code(), Some(0), "{f}");
    assert_eq!(f["warnings_by_kind"].get("psn-skipped"), None, "{f}");
    // 112..=113 never sent.
    let skipping = tmp("skip.pcap");
    psns.push(114);
    write_requests(&skipping, &psns);
    let out = roxe(&["decode", "-v", skipping.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a warning, not a failure: {text}"
    );
    assert!(
        text.contains("warning [psn-skipped]: requester sent PSN 114 first, 2 PSNs after the highest it had sent (111)"),
        "{text}"
    );
    assert!(text.contains("warnings: psn-skipped x1"), "{text}");
}
