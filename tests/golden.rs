//! Real captures from mlx5 hardware and Linux rxe: every RoCEv2 packet
//! parses, its ICRC verifies (except the one corrupted on purpose), no rule
//! of the IBA is broken, and re-emitting the parsed representation gives the
//! original bytes back exactly.

use roxe_suite::{golden_captures, is_deliberately_bad};
use roxe_wire::frame::Datagram;
use roxe_wire::lint::{lint, Severity};
use roxe_wire::packet::set_icrc;
use roxe_wire::pcap::{self, L3};
use roxe_wire::{icrc, Opcode, Packet, PacketRepr, ROCEV2_PORT};
use std::collections::BTreeSet;

#[test]
fn every_golden_packet_parses_verifies_and_re_emits_exactly() {
    let files = golden_captures();
    assert!(files.len() >= 20, "golden captures missing: {files:?}");
    let mut total = 0usize;
    let mut bad_icrc_seen = 0usize;
    let mut ipv4_explained = 0usize;
    let mut opcodes = BTreeSet::new();
    for path in &files {
        let mut in_file = 0usize;
        let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let reader = pcap::CaptureReader::new(std::io::BufReader::new(file))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for rec in reader {
            let rec = rec.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let at = format!("{} frame {}", path.display(), rec.frame);
            let ip = match pcap::link_payload(rec.link, &rec.data) {
                Some(L3::Ipv4(b)) | Some(L3::Ipv6(b)) => b,
                _ => continue, // RoCEv1 and non-IP frames
            };
            let Ok(dg) = Datagram::parse(ip) else {
                continue;
            };
            if dg.dst_port != ROCEV2_PORT {
                continue;
            }
            assert!(!dg.truncated, "{at}: truncated");
            assert!(
                !dg.bad_ipv4_checksum && !dg.fragment && !dg.udp_length_mismatch,
                "{at}"
            );

            let packet = Packet::new_checked(dg.payload).unwrap_or_else(|e| panic!("{at}: {e}"));
            let repr = PacketRepr::parse(&packet).unwrap_or_else(|e| panic!("{at}: {e}"));
            opcodes.insert(repr.bth.opcode);
            let errors: Vec<_> = lint(&packet)
                .into_iter()
                .filter(|p| p.severity() == Severity::Error)
                .collect();
            assert!(errors.is_empty(), "{at}: {errors:?}");

            let check = icrc::check(dg.ip_header, dg.udp_header, dg.payload).unwrap();
            if is_deliberately_bad(path, rec.frame) {
                assert!(!check.ok(), "{at}: the corrupted ICRC verified");
                bad_icrc_seen += 1;
            } else {
                assert!(
                    check.ok(),
                    "{at}: ICRC {:08x} != {:08x}",
                    check.wire,
                    check.expected
                );
            }

            // What a UDP socket sees of an IPv4 packet: no identification,
            // no flags. The ICRC computed for identification 0 with DF set
            // differs from the wire's by a change those fields explain
            // (what `ROXE_ICRC=warn` accepts), except for the damaged one.
            if let (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) = (dg.src, dg.dst) {
                let body = &dg.payload[..dg.payload.len() - 4];
                let c0 = icrc::compute_ipv4(s, d, dg.src_port, ROCEV2_PORT, 0, body).unwrap();
                let explained =
                    icrc::UnseenIpv4Fields::new(body.len()).explains(c0 ^ packet.icrc());
                assert_eq!(explained, !is_deliberately_bad(path, rec.frame), "{at}");
                ipv4_explained += usize::from(explained);
            }

            // Re-emit: headers and payload byte for byte, then the ICRC
            // recomputed over the captured IP/UDP headers.
            let mut out = vec![0u8; dg.payload.len()];
            let n = repr.emit(&mut out).unwrap_or_else(|e| panic!("{at}: {e}"));
            assert_eq!(n, dg.payload.len(), "{at}: length");
            let c = icrc::compute(dg.ip_header, dg.udp_header, &out[..n - 4]).unwrap();
            set_icrc(&mut out, c);
            if is_deliberately_bad(path, rec.frame) {
                assert_eq!(out[..n - 4], dg.payload[..n - 4], "{at}");
            } else {
                assert_eq!(out, dg.payload, "{at}: re-emitted bytes differ");
            }
            in_file += 1;
        }
        assert!(in_file > 0, "{}: no RoCEv2 packet", path.display());
        total += in_file;
    }
    assert!(
        ipv4_explained > 1000,
        "{ipv4_explained} IPv4 packets checked"
    );
    eprintln!(
        "{} captures, {total} RoCEv2 packets ({ipv4_explained} IPv4 explained by an identification), {} opcodes: {:?}",
        files.len(),
        opcodes.len(),
        opcodes.iter().map(|o| o.name()).collect::<Vec<_>>()
    );
    // The project's copy and, when present, the shared original.
    assert!(
        bad_icrc_seen >= 1,
        "the deliberately corrupted packet was not seen"
    );
    for must in [
        Opcode::RcSendOnly,
        Opcode::RcWriteFirst,
        Opcode::RcReadResponseMiddle,
        Opcode::RcAcknowledge,
        Opcode::RcCompareSwap,
        Opcode::RcFetchAdd,
        Opcode::RcAtomicAcknowledge,
        Opcode::UcSendFirst,
        Opcode::UdSendOnly,
        Opcode::UdSendOnlyImm,
        Opcode::Cnp,
    ] {
        assert!(opcodes.contains(&must), "no {must} in the golden captures");
    }
}

/// The ConnectX-4 Lx CNP recorded in scapy's test suite: ICRC wire bytes 82 fd 00 2a.
#[test]
fn connectx4_cnp_icrc_vector() {
    let path = roxe_suite::workspace_root().join("tests/data/golden/public-mlx5-cx4lx-cnp.pcap");
    let file = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
    let rec = pcap::CaptureReader::new(file)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let Some(L3::Ipv4(ip)) = pcap::link_payload(rec.link, &rec.data) else {
        panic!("not IPv4")
    };
    let dg = Datagram::parse(ip).unwrap();
    let p = Packet::new_checked(dg.payload).unwrap();
    assert_eq!(p.opcode(), Opcode::Cnp);
    assert!(p.bth().becn());
    assert_eq!(
        &dg.payload[dg.payload.len() - 4..],
        &[0x82, 0xfd, 0x00, 0x2a]
    );
    assert_eq!(
        icrc::compute(dg.ip_header, dg.udp_header, p.icrc_covered()).unwrap(),
        u32::from_le_bytes([0x82, 0xfd, 0x00, 0x2a])
    );
}
