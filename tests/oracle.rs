//! Packets roxe's builder emits, for every opcode over IPv4 and IPv6, pass
//! the independent checker ../shared/tools/roce-check (headers, lengths,
//! ICRC, PSN flows) with exit status 0 and no warning (`--strict`).

use roxe_wire::aeth::{AethSyndrome, NakCode, RnrTimer};
use roxe_wire::frame::{build_datagram, IpFields};
use roxe_wire::pcap::PcapWriter;
use roxe_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, ExtHeaders, FethRepr, Opcode,
    PacketRepr, Psn, RethRepr, GSI_QKEY, ROCEV2_PORT,
};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;

const PMTU: usize = 256;

/// One direction of traffic to one QP, with its own PSN counter.
struct Flow {
    src: IpAddr,
    dst: IpAddr,
    dest_qp: u32,
    psn: Psn,
    /// An XRC flow: RC opcodes pushed on it go out as their XRC twins, the
    /// requests with an XRCETH naming this SRQ number.
    xrc_srqn: Option<u32>,
}

struct Capture {
    writer: PcapWriter<Vec<u8>>,
    ts_ns: u64,
    seen: BTreeSet<Opcode>,
}

impl Capture {
    fn push(
        &mut self,
        flow: &mut Flow,
        opcode: Opcode,
        ext: ExtHeaders,
        payload: &[u8],
        psns: u32,
    ) -> Psn {
        let psn = flow.psn;
        let (opcode, ext) = match flow.xrc_srqn {
            Some(srqn) => {
                let x = opcode
                    .on_transport(roxe_wire::Transport::Xrc)
                    .unwrap_or_else(|| panic!("{opcode} has no XRC twin"));
                let xrceth = (!x.is_response()).then_some(srqn);
                (x, ExtHeaders { xrceth, ..ext })
            }
            None => (opcode, ext),
        };
        let repr = PacketRepr {
            bth: BthRepr {
                ack_req: matches!(
                    opcode.transport(),
                    roxe_wire::Transport::Rc | roxe_wire::Transport::Xrc
                ) && !opcode.is_response()
                    && opcode.ends_message(),
                solicited: opcode.has_immediate() && opcode.ends_message(),
                becn: opcode == Opcode::Cnp,
                ..BthRepr::new(opcode, flow.dest_qp, psn)
            },
            ext,
            payload,
        };
        let mut buf = [0u8; 9000];
        let sport = if opcode == Opcode::Cnp {
            0
        } else {
            0xC000 | (flow.dest_qp as u16 & 0x3FFF)
        };
        let n = build_datagram(
            &mut buf,
            flow.src,
            flow.dst,
            sport,
            ROCEV2_PORT,
            IpFields::default(),
            &repr,
        )
        .unwrap_or_else(|e| panic!("{opcode}: {e}"));
        self.writer.write_ip(self.ts_ns, &buf[..n]).unwrap();
        self.ts_ns += 1_000;
        self.seen.insert(opcode);
        flow.psn += psns;
        psn
    }
}

fn ext() -> ExtHeaders {
    ExtHeaders::NONE
}
fn reth(len: u32) -> ExtHeaders {
    ExtHeaders {
        reth: Some(RethRepr {
            va: 0x7f00_0000_1000,
            rkey: 0x1234,
            dma_len: len,
        }),
        ..ext()
    }
}
fn imm() -> ExtHeaders {
    ExtHeaders {
        imm_dt: Some(0xdead_beef),
        ..ext()
    }
}
fn aeth(s: AethSyndrome, msn: u32) -> ExtHeaders {
    ExtHeaders {
        aeth: Some(AethRepr { syndrome: s, msn }),
        ..ext()
    }
}

/// Every RC request and response (or, on an XRC flow, their XRC twins),
/// from `rc` and answered on `resp`.
fn reliable(cap: &mut Capture, rc: &mut Flow, resp: &mut Flow, data: &[u8]) {
    let full = &data[..PMTU];
    let ack = AethSyndrome::ACK;
    let mut msn = 0;
    let mut acked = |cap: &mut Capture, resp: &mut Flow, psn: Psn| {
        msn += 1;
        resp.psn = psn;
        cap.push(resp, Opcode::RcAcknowledge, aeth(ack, msn), &[], 1);
    };

    // RC SENDs.
    cap.push(rc, Opcode::RcSendFirst, ext(), full, 1);
    cap.push(rc, Opcode::RcSendMiddle, ext(), full, 1);
    let p = cap.push(rc, Opcode::RcSendLast, ext(), &data[..13], 1);
    acked(cap, resp, p);
    cap.push(rc, Opcode::RcSendFirst, ext(), full, 1);
    let p = cap.push(rc, Opcode::RcSendLastImm, imm(), &data[..PMTU], 1);
    acked(cap, resp, p);
    let p = cap.push(rc, Opcode::RcSendOnly, ext(), &[], 1);
    acked(cap, resp, p);
    let p = cap.push(rc, Opcode::RcSendOnlyImm, imm(), &data[..5], 1);
    acked(cap, resp, p);
    let inv = ExtHeaders {
        ieth: Some(0x5678),
        ..ext()
    };
    let p = cap.push(rc, Opcode::RcSendOnlyInv, inv, &data[..64], 1);
    acked(cap, resp, p);
    cap.push(rc, Opcode::RcSendFirst, ext(), full, 1);
    let p = cap.push(rc, Opcode::RcSendLastInv, inv, &data[..3], 1);
    acked(cap, resp, p);

    // RC WRITEs.
    cap.push(rc, Opcode::RcWriteFirst, reth(2 * PMTU as u32 + 5), full, 1);
    cap.push(rc, Opcode::RcWriteMiddle, ext(), full, 1);
    let p = cap.push(rc, Opcode::RcWriteLast, ext(), &data[..5], 1);
    acked(cap, resp, p);
    cap.push(rc, Opcode::RcWriteFirst, reth(PMTU as u32 + 1), full, 1);
    let p = cap.push(rc, Opcode::RcWriteLastImm, imm(), &data[..1], 1);
    acked(cap, resp, p);
    let p = cap.push(rc, Opcode::RcWriteOnly, reth(18), &data[..18], 1);
    acked(cap, resp, p);
    let wi = ExtHeaders {
        imm_dt: Some(1),
        ..reth(0)
    };
    let p = cap.push(rc, Opcode::RcWriteOnlyImm, wi, &[], 1);
    acked(cap, resp, p);

    // RC READ of 2.5 PMTUs: three PSNs, answered FIRST/MIDDLE/LAST.
    let len = 2 * PMTU + PMTU / 2;
    let p = cap.push(rc, Opcode::RcReadRequest, reth(len as u32), &[], 3);
    resp.psn = p;
    msn += 1;
    cap.push(resp, Opcode::RcReadResponseFirst, aeth(ack, msn), full, 1);
    cap.push(resp, Opcode::RcReadResponseMiddle, ext(), full, 1);
    cap.push(
        resp,
        Opcode::RcReadResponseLast,
        aeth(ack, msn),
        &data[..PMTU / 2],
        1,
    );
    let p = cap.push(rc, Opcode::RcReadRequest, reth(8), &[], 1);
    resp.psn = p;
    msn += 1;
    cap.push(
        resp,
        Opcode::RcReadResponseOnly,
        aeth(ack, msn),
        &data[..8],
        1,
    );

    // Atomics.
    for op in [Opcode::RcCompareSwap, Opcode::RcFetchAdd] {
        let at = ExtHeaders {
            atomic_eth: Some(AtomicEthRepr {
                va: 0x7f00_0000_2000,
                rkey: 0x1234,
                swap_add: 5,
                compare: 0,
            }),
            ..ext()
        };
        let p = cap.push(rc, op, at, &[], 1);
        resp.psn = p;
        msn += 1;
        let ae = ExtHeaders {
            atomic_ack_eth: Some(AtomicAckEthRepr { orig: 42 }),
            ..aeth(ack, msn)
        };
        cap.push(resp, Opcode::RcAtomicAcknowledge, ae, &[], 1);
    }
    // IBA 1.5 FLUSH and ATOMIC_WRITE (RC only), answered by zero-length READ
    // responses.
    if rc.xrc_srqn.is_none() {
        let fl = ExtHeaders {
            feth: Some(FethRepr { raw: 0x11 }),
            ..reth(64)
        };
        let p = cap.push(rc, Opcode::RcFlush, fl, &[], 1);
        resp.psn = p;
        msn += 1;
        cap.push(resp, Opcode::RcReadResponseOnly, aeth(ack, msn), &[], 1);
        let p = cap.push(rc, Opcode::RcAtomicWrite, reth(8), &data[..8], 1);
        resp.psn = p;
        msn += 1;
        cap.push(resp, Opcode::RcReadResponseOnly, aeth(ack, msn), &[], 1);
    }
    // NAKs (an RNR NAK and a PSN sequence error) are responses too.
    let rnr = AethSyndrome::RnrNak(RnrTimer::new(12).unwrap());
    let p = cap.push(rc, Opcode::RcSendOnly, ext(), &data[..4], 1);
    resp.psn = p;
    cap.push(resp, Opcode::RcAcknowledge, aeth(rnr, msn), &[], 1);
    resp.psn = p;
    cap.push(
        resp,
        Opcode::RcAcknowledge,
        aeth(AethSyndrome::Nak(NakCode::PsnSequenceError), msn),
        &[],
        1,
    );
}

/// A conversation that uses every opcode roxe knows, in valid message order.
fn conversation(cap: &mut Capture, a: IpAddr, b: IpAddr, start: Psn) {
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let full = &data[..PMTU];
    let mut rc = Flow {
        src: a,
        dst: b,
        dest_qp: 0x12,
        psn: start,
        xrc_srqn: None,
    };
    let mut rc_resp = Flow {
        src: b,
        dst: a,
        dest_qp: 0x11,
        psn: start,
        xrc_srqn: None,
    };
    let mut uc = Flow {
        src: a,
        dst: b,
        dest_qp: 0x22,
        psn: start,
        xrc_srqn: None,
    };
    let mut ud = Flow {
        src: a,
        dst: b,
        dest_qp: 0x33,
        psn: Psn::new(7),
        xrc_srqn: None,
    };
    reliable(cap, &mut rc, &mut rc_resp, &data);
    // The same over XRC, to and from another QP pair.
    let (mut xrc, mut xrc_resp) = (
        Flow {
            dest_qp: 0x44,
            xrc_srqn: Some(0x2a),
            ..rc
        },
        Flow {
            dest_qp: 0x43,
            xrc_srqn: Some(0),
            psn: start,
            ..rc_resp
        },
    );
    xrc.psn = start;
    reliable(cap, &mut xrc, &mut xrc_resp, &data);

    // UC.
    cap.push(&mut uc, Opcode::UcSendFirst, ext(), full, 1);
    cap.push(&mut uc, Opcode::UcSendMiddle, ext(), full, 1);
    cap.push(&mut uc, Opcode::UcSendLast, ext(), &data[..9], 1);
    cap.push(&mut uc, Opcode::UcSendFirst, ext(), full, 1);
    cap.push(&mut uc, Opcode::UcSendLastImm, imm(), &data[..9], 1);
    cap.push(&mut uc, Opcode::UcSendOnly, ext(), &data[..100], 1);
    cap.push(&mut uc, Opcode::UcSendOnlyImm, imm(), &data[..100], 1);
    cap.push(
        &mut uc,
        Opcode::UcWriteFirst,
        reth(2 * PMTU as u32 + 1),
        full,
        1,
    );
    cap.push(&mut uc, Opcode::UcWriteMiddle, ext(), full, 1);
    cap.push(&mut uc, Opcode::UcWriteLast, ext(), &data[..1], 1);
    cap.push(
        &mut uc,
        Opcode::UcWriteFirst,
        reth(PMTU as u32 + 2),
        full,
        1,
    );
    cap.push(&mut uc, Opcode::UcWriteLastImm, imm(), &data[..2], 1);
    cap.push(&mut uc, Opcode::UcWriteOnly, reth(31), &data[..31], 1);
    let wi = ExtHeaders {
        imm_dt: Some(9),
        ..reth(32)
    };
    cap.push(&mut uc, Opcode::UcWriteOnlyImm, wi, &data[..32], 1);

    // UD, including the largest payload and a GSI MAD-sized one to QP1.
    let deth = |qkey| ExtHeaders {
        deth: Some(DethRepr {
            qkey,
            src_qp: 0x44,
            reserved: 0,
        }),
        ..ext()
    };
    cap.push(
        &mut ud,
        Opcode::UdSendOnly,
        deth(0x1111_1111),
        &data[..4096],
        1,
    );
    let di = ExtHeaders {
        imm_dt: Some(3),
        ..deth(0x1111_1111)
    };
    cap.push(&mut ud, Opcode::UdSendOnlyImm, di, &data[..1], 1);
    let mut gsi = Flow {
        src: a,
        dst: b,
        dest_qp: 1,
        psn: Psn::new(0),
        xrc_srqn: None,
    };
    cap.push(
        &mut gsi,
        Opcode::UdSendOnly,
        deth(GSI_QKEY),
        &data[..256],
        1,
    );

    // CNP back to the sender.
    let mut cnp = Flow {
        src: b,
        dst: a,
        dest_qp: 0x11,
        psn: Psn::new(0),
        xrc_srqn: None,
    };
    cap.push(
        &mut cnp,
        Opcode::Cnp,
        ExtHeaders {
            cnp_reserved: Some([0; 16]),
            ..ext()
        },
        &[],
        0,
    );
}

#[test]
fn builder_output_passes_roce_check_for_every_opcode() {
    let mut cap = Capture {
        writer: PcapWriter::new(Vec::new()).unwrap(),
        ts_ns: 1_700_000_000_000_000_000,
        seen: BTreeSet::new(),
    };
    conversation(
        &mut cap,
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), // testnet: allow (packet bytes only)
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), // testnet: allow (packet bytes only)
        Psn::new(0xFF_FFF0),
    );
    conversation(
        &mut cap,
        IpAddr::V6("fd00::1".parse::<Ipv6Addr>().unwrap()),
        IpAddr::V6("fd00::2".parse::<Ipv6Addr>().unwrap()),
        Psn::new(0x10),
    );
    let all: BTreeSet<Opcode> = Opcode::ALL.iter().copied().collect();
    assert_eq!(cap.seen, all, "not every opcode was emitted");
    let bytes = cap.writer.into_inner().unwrap();

    let dir = std::env::temp_dir().join(format!("roxe-oracle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("every-opcode.pcap");
    std::fs::write(&path, &bytes).unwrap();

    let Some(tool) = roxe_suite::roce_check() else {
        return;
    };
    let out = Command::new("python3")
        .arg(&tool)
        .arg("--strict")
        .arg("-w")
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "roce-check rejected the builder's packets ({}):\n{text}\n{}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
