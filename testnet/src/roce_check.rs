//! Captures through `roce-check` (the independent oracle in
//! `../shared/tools`), strictly, with one exception it cannot judge.
//!
//! `--strict` fails on warnings, and one warning is a legal transport
//! behaviour: a go-back-N (NAK, timeout, tail-loss probe) that an ACK
//! overtakes ends where the ACK says, and the requester goes on with the
//! first PSN it never sent; roce-check expects the packet after a
//! retransmission to be the next PSN and reports a `psn-gap` (and, inside
//! a WRITE, a `write-length`); it also counts a resent WRITE MIDDLE (a
//! probe's) into the message's length again (`write-length`), and the
//! responses of a READ replayed from a middle PSN (a requester asking
//! again for the rest of a READ; the responder goes on with MIDDLE and
//! LAST, as rxe does) into the READ's length again (`read-length`). So a
//! capture passes when roce-check passes it strictly, or when its only
//! warnings are those kinds, it passes
//! without `--strict`, and [`roxe_wire::frontier`] finds that no
//! requester ever sent a PSN before all earlier ones.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The checker beside the project (`../shared/tools/roce-check`), if it
/// and python3 are there; under CI (`CI=true`) they must be.
pub fn tool() -> Option<PathBuf> {
    let t = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/tools/roce-check");
    let python = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !t.is_file() || !python {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI must have roce-check and python3"
        );
        eprintln!("SKIP: roce-check oracle not available");
        return None;
    }
    Some(t)
}

/// Warnings an overtaken go-back or a replayed READ causes in roce-check.
const OVERTAKEN_GO_BACK: [&str; 3] = ["psn-gap", "write-length", "read-length"];

/// Run `python3 TOOL --strict -q CAPTURE`; `Ok(report)` when it passes,
/// or fails only on an overtaken go-back (then the report says so);
/// `Err(report)` otherwise.
pub fn strict(tool: &Path, capture: &Path) -> Result<String, String> {
    let run = |strict: bool| {
        let mut c = Command::new("python3");
        c.arg(tool);
        if strict {
            c.arg("--strict");
        }
        let out = c.arg("-q").arg(capture).output();
        match out {
            Ok(o) => (
                o.status.success(),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ),
            ),
            Err(e) => (false, format!("python3 {}: {e}", tool.display())),
        }
    };
    let (ok, report) = run(true);
    if ok {
        return Ok(report);
    }
    let kinds: Vec<&str> = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("warnings by kind: "))
        .map(|l| l.split(", ").filter_map(|k| k.split('=').next()).collect())
        .unwrap_or_default();
    // These kinds come of a retransmission: a go-back overtaken by an ACK
    // (psn-gap), or a resent packet counted again into its WRITE's length
    // (write-length; a probe resends the highest PSN, which may be a
    // MIDDLE), or a READ's responses replayed from a middle PSN, which as
    // rxe's go on with MIDDLE and LAST and are counted into the READ's
    // length again (read-length). Without any retransmission they are
    // real.
    let retransmitted = report
        .lines()
        .find_map(|l| l.split("retransmitted packets: ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    if kinds.is_empty()
        || retransmitted == 0
        || kinds.iter().any(|k| !OVERTAKEN_GO_BACK.contains(k))
    {
        return Err(report);
    }
    let (lenient_ok, lenient) = run(false);
    if !lenient_ok {
        return Err(lenient);
    }
    let file = std::fs::File::open(capture)
        .map_err(|e| format!("{report}\nopen {}: {e}", capture.display()))?;
    match roxe_wire::frontier::skipped_psns(std::io::BufReader::new(file)) {
        Ok(skips) if skips.is_empty() => Ok(format!(
            "{report}\n(the {kinds:?} warnings come of retransmissions: \
             no requester sent a PSN before every earlier one)"
        )),
        Ok(skips) => Err(format!(
            "{report}\nPSNs skipped:\n{}",
            skips
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        )),
        Err(e) => Err(format!("{report}\nreading {}: {e}", capture.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roxe_wire::frame::{build_datagram, IpFields};
    use roxe_wire::pcap::PcapWriter;
    use roxe_wire::{BthRepr, ExtHeaders, Opcode, PacketRepr, Psn, RethRepr};
    use std::net::{IpAddr, Ipv4Addr};

    /// Requester and responder addresses of the synthetic captures.
    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)); // testnet: allow (a packet written to a file)
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)); // testnet: allow (a packet written to a file)

    /// A pcap being written in memory, saved under this process's temp
    /// directory.
    struct Capture {
        w: PcapWriter<Vec<u8>>,
        buf: [u8; 1024],
    }

    impl Capture {
        fn new() -> Capture {
            Capture {
                w: PcapWriter::new(Vec::new()).unwrap(),
                buf: [0u8; 1024],
            }
        }

        fn emit(&mut self, from: IpAddr, to: IpAddr, pkt: &PacketRepr<'_>) {
            let n = build_datagram(
                &mut self.buf,
                from,
                to,
                0xc000,
                4791,
                IpFields::default(),
                pkt,
            )
            .unwrap();
            self.w.write_ip(1, &self.buf[..n]).unwrap();
        }

        fn save(self, name: &str) -> PathBuf {
            let dir = std::env::temp_dir().join(format!("roxe-roce-check-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(name);
            std::fs::write(&path, self.w.into_inner().unwrap()).unwrap();
            path
        }
    }

    /// A WRITE of 4 packets of 256 bytes (RETH length `len`), its packets
    /// sent in the order of `psns` (offsets from PSN 100).
    fn write_capture(name: &str, len: u32, psns: &[u32]) -> PathBuf {
        let payload = [7u8; 256];
        let mut c = Capture::new();
        for &i in psns {
            let op = match i {
                0 => Opcode::RcWriteFirst,
                3 => Opcode::RcWriteLast,
                _ => Opcode::RcWriteMiddle,
            };
            let pkt = PacketRepr {
                bth: BthRepr::new(op, 0x11, Psn::new(100 + i)),
                ext: ExtHeaders {
                    reth: (i == 0).then_some(RethRepr {
                        va: 0x1000,
                        rkey: 7,
                        dma_len: len,
                    }),
                    ..ExtHeaders::NONE
                },
                payload: &payload,
            };
            c.emit(A, B, &pkt);
        }
        c.save(name)
    }

    /// A probe resends a MIDDLE of a WRITE: roce-check counts it into the
    /// length again (write-length); accepted. A wrong length with nothing
    /// resent is not.
    #[test]
    fn a_resent_middle_passes_but_a_wrong_length_does_not() {
        let Some(t) = tool() else { return };
        let resent = write_capture("resent.pcap", 1024, &[0, 1, 2, 2, 3]);
        let ok = strict(&t, &resent);
        assert!(ok.is_ok(), "{ok:?}");
        assert!(ok.unwrap().contains("write-length"));
        let wrong = write_capture("wrong.pcap", 2048, &[0, 1, 2, 3]);
        assert!(strict(&t, &wrong).is_err());
        let clean = write_capture("clean.pcap", 1024, &[0, 1, 2, 3]);
        assert!(strict(&t, &clean).is_ok());
    }

    /// A READ of `len` bytes at PSN 100 (4 responses of 256 bytes): the
    /// request, the responses `before` (offsets from PSN 100), the
    /// request asked again from each response in `again` on, then the
    /// responses `after`.
    fn read_capture(name: &str, len: u32, before: &[u32], again: &[u32], after: &[u32]) -> PathBuf {
        let payload = [7u8; 256];
        let mut c = Capture::new();
        let request = |i: u32, len: u32| PacketRepr {
            bth: BthRepr::new(Opcode::RcReadRequest, 0x11, Psn::new(100 + i)),
            ext: ExtHeaders {
                reth: Some(RethRepr {
                    va: 0x1000 + u64::from(i) * 256,
                    rkey: 7,
                    dma_len: len,
                }),
                ..ExtHeaders::NONE
            },
            payload: &[],
        };
        let response = |i: u32| {
            let op = match i {
                0 => Opcode::RcReadResponseFirst,
                3 => Opcode::RcReadResponseLast,
                _ => Opcode::RcReadResponseMiddle,
            };
            PacketRepr {
                bth: BthRepr::new(op, 0x22, Psn::new(100 + i)),
                ext: ExtHeaders {
                    aeth: op.headers().contains(roxe_wire::HeaderSet::AETH).then_some(
                        roxe_wire::AethRepr {
                            syndrome: roxe_wire::AethSyndrome::ACK,
                            msn: 1,
                        },
                    ),
                    ..ExtHeaders::NONE
                },
                payload: &payload,
            }
        };
        c.emit(A, B, &request(0, len));
        for &i in before {
            c.emit(B, A, &response(i));
        }
        for &i in again {
            c.emit(A, B, &request(i, len - 256 * i));
        }
        for &i in after {
            c.emit(B, A, &response(i));
        }
        c.save(name)
    }

    /// The requester asks again for a READ from its second response (a
    /// probe, the rest late); the responder, which had sent the third
    /// meanwhile, replays from there with MIDDLE and LAST (rxe's rule):
    /// roce-check counts the replayed responses into the READ's length
    /// again (read-length); accepted. A wrong length with nothing resent
    /// is not.
    #[test]
    fn a_read_replayed_from_a_middle_psn_passes_but_a_wrong_length_does_not() {
        let Some(t) = tool() else { return };
        let replayed = read_capture("read-replayed.pcap", 1024, &[0, 1, 2], &[1], &[1, 2, 3]);
        let ok = strict(&t, &replayed);
        assert!(ok.is_ok(), "{ok:?}");
        assert!(ok.unwrap().contains("read-length"));
        let wrong = read_capture("read-wrong.pcap", 1024, &[0, 1, 2, 2, 3], &[], &[]);
        assert!(strict(&t, &wrong).is_err());
        let clean = read_capture("read-clean.pcap", 1024, &[0, 1, 2, 3], &[], &[]);
        assert!(strict(&t, &clean).is_ok());
    }
}
