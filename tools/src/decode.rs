//! `roxe decode`: one line per RoCEv2 packet, a summary, and a verdict that
//! includes the ICRC (which Wireshark decodes but never checks).

use clap::Args as ClapArgs;
use roxe_wire::cm::{self, rdma_cm, CmMad, CmMessage};
use roxe_wire::frame::Datagram;
use roxe_wire::frontier::Frontier;
use roxe_wire::ip::UdpChecksum;
use roxe_wire::lint::{lint, Severity};
use roxe_wire::pcap::{self, CaptureRecord, L3};
use roxe_wire::{Error as WireError, Packet, PacketRepr, ROCEV2_PORT};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit status: every packet good.
const EXIT_OK: u8 = 0;
/// Exit status: a malformed, truncated or bad-ICRC packet.
const EXIT_FAIL: u8 = 1;
/// Exit status: a file that cannot be read.
const EXIT_UNREADABLE: u8 = 2;
/// Exit status: no RoCEv2 packet at all.
const EXIT_EMPTY: u8 = 3;

#[derive(ClapArgs)]
pub struct Args {
    /// Capture files (pcap or pcapng).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Also print every header field and the IP details of each packet.
    #[arg(short, long)]
    verbose: bool,
    /// Print one JSON document instead of text (with -v: including every packet).
    #[arg(long)]
    json: bool,
    /// Treat this UDP destination port as RoCEv2 too (4791 always is).
    #[arg(long, value_name = "PORT")]
    port: Vec<u16>,
}

/// A problem found in one packet.
struct Finding {
    severity: Severity,
    kind: &'static str,
    text: String,
}

/// Per-file tallies.
#[derive(Default)]
pub(crate) struct Summary {
    pub(crate) frames: u64,
    roce: u64,
    ipv4: u64,
    ipv6: u64,
    non_roce_frames: u64,
    rocev1_frames: u64,
    opcodes: BTreeMap<String, u64>,
    icrc_ok: u64,
    icrc_bad: u64,
    icrc_unchecked: u64,
    malformed: u64,
    truncated: u64,
    errors_by_kind: BTreeMap<&'static str, u64>,
    warnings_by_kind: BTreeMap<&'static str, u64>,
    acks: u64,
    naks: BTreeMap<String, u64>,
    cnps: u64,
    udp_checksum: BTreeMap<&'static str, u64>,
    /// Each requester's highest PSN sent, to find PSNs it never sent.
    frontier: Frontier,
}

impl Summary {
    /// RoCEv2 packets seen.
    pub(crate) fn roce_count(&self) -> u64 {
        self.roce
    }

    pub(crate) fn status(&self) -> u8 {
        if self.malformed > 0 || self.icrc_bad > 0 || self.truncated > 0 {
            EXIT_FAIL
        } else if self.roce == 0 {
            EXIT_EMPTY
        } else {
            EXIT_OK
        }
    }

    fn result(&self) -> &'static str {
        match self.status() {
            EXIT_OK => "PASS",
            EXIT_EMPTY => "EMPTY",
            _ => "FAIL",
        }
    }
}

/// What was decoded from one frame carrying RoCEv2.
pub(crate) struct Decoded {
    frame: u64,
    ts_ns: u64,
    src: String,
    dst: String,
    opcode: String,
    dest_qp: Option<u32>,
    psn: Option<u32>,
    flags: Vec<&'static str>,
    fields: Vec<(String, String)>,
    detail: Vec<String>,
    payload_len: Option<usize>,
    icrc: &'static str,
    icrc_wire: Option<u32>,
    icrc_expected: Option<u32>,
    findings: Vec<Finding>,
    /// The CM message of a MAD to QP1, summarised.
    cm: Option<String>,
}

pub fn run(args: &Args) -> ExitCode {
    let mut worst = EXIT_OK;
    let mut docs = Vec::new();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for path in &args.files {
        match decode_file(args, path, &mut out) {
            Ok((summary, packets)) => {
                let status = summary.status();
                worst = worse(worst, status);
                if args.json {
                    docs.push(summary_json(
                        path,
                        &summary,
                        args.verbose.then_some(packets),
                    ));
                } else {
                    let _ = print_summary(&mut out, path, &summary);
                }
            }
            Err(e) => {
                worst = worse(worst, EXIT_UNREADABLE);
                if args.json {
                    docs.push(json!({"file": path.display().to_string(), "error": e, "exit_status": EXIT_UNREADABLE}));
                } else {
                    eprintln!("roxe decode: {}: {e}", path.display());
                }
            }
        }
    }
    if args.json {
        let doc = json!({"tool": "roxe decode", "version": env!("CARGO_PKG_VERSION"), "exit_status": worst, "files": docs});
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&doc).unwrap_or_default()
        );
    }
    ExitCode::from(worst)
}

/// The worse of two exit statuses: unreadable > failed > empty > ok.
fn worse(a: u8, b: u8) -> u8 {
    let rank = |s: u8| match s {
        EXIT_UNREADABLE => 3,
        EXIT_FAIL => 2,
        EXIT_EMPTY => 1,
        _ => 0,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

fn decode_file(
    args: &Args,
    path: &PathBuf,
    out: &mut impl std::io::Write,
) -> Result<(Summary, Vec<Value>), String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let reader =
        pcap::CaptureReader::new(std::io::BufReader::new(file)).map_err(|e| e.to_string())?;
    let mut s = Summary::default();
    let mut packets = Vec::new();
    if !args.json {
        let _ = writeln!(out, "== {}", path.display());
    }
    for rec in reader {
        let rec = rec.map_err(|e| e.to_string())?;
        s.frames += 1;
        let Some(d) = decode_frame(&args.port, &rec, &mut s) else {
            continue;
        };
        tally(&mut s, &d);
        if args.json {
            if args.verbose {
                packets.push(packet_json(&d));
            }
        } else {
            let _ = print_packet(out, &d, args.verbose);
        }
    }
    Ok((s, packets))
}

/// Decode one frame (RoCEv2 on port 4791 or one of `ports`); None for a
/// frame that carries no RoCEv2 (counted in `s`).
pub(crate) fn decode_frame(ports: &[u16], rec: &CaptureRecord, s: &mut Summary) -> Option<Decoded> {
    let ip = match pcap::link_payload(rec.link, &rec.data) {
        Some(L3::Ipv4(b)) | Some(L3::Ipv6(b)) => b,
        Some(L3::Other { ethertype: 0x8915 }) => {
            s.rocev1_frames += 1;
            return None;
        }
        _ => {
            s.non_roce_frames += 1;
            return None;
        }
    };
    let dg = match Datagram::parse(ip) {
        Ok(dg) if dg.dst_port == ROCEV2_PORT || ports.contains(&dg.dst_port) => dg,
        _ => {
            s.non_roce_frames += 1;
            return None;
        }
    };
    let mut d = Decoded {
        frame: rec.frame,
        ts_ns: rec.ts_ns,
        src: format!("{}:{}", fmt_ip(dg.src), dg.src_port),
        dst: fmt_ip(dg.dst),
        opcode: String::new(),
        dest_qp: None,
        psn: None,
        flags: Vec::new(),
        fields: Vec::new(),
        detail: Vec::new(),
        payload_len: None,
        icrc: "unchecked",
        icrc_wire: None,
        icrc_expected: None,
        findings: Vec::new(),
        cm: None,
    };
    let err = |d: &mut Decoded, kind: &'static str, text: String| {
        d.findings.push(Finding {
            severity: Severity::Error,
            kind,
            text,
        })
    };
    if dg.src.is_ipv4() {
        s.ipv4 += 1;
    } else {
        s.ipv6 += 1;
    }
    if dg.bad_ipv4_checksum {
        err(
            &mut d,
            "ipv4-checksum",
            "IPv4 header checksum is wrong".into(),
        );
    }
    if dg.fragment {
        err(
            &mut d,
            "ip-fragment",
            "IP fragment (RoCEv2 is never fragmented)".into(),
        );
    }
    if dg.udp_length_mismatch {
        err(
            &mut d,
            "udp-length",
            "UDP length differs from the IP payload length".into(),
        );
    }
    match dg.udp_checksum {
        Some(UdpChecksum::Bad) => err(
            &mut d,
            "udp-checksum",
            "UDP checksum is wrong (a Linux/rxe receiver drops the packet)".into(),
        ),
        Some(c) => {
            *s.udp_checksum
                .entry(match c {
                    UdpChecksum::Zero => "zero",
                    UdpChecksum::Correct => "correct",
                    _ => "offload",
                })
                .or_default() += 1
        }
        None => {}
    }
    if let Some(id) = dg.ipv4_ident {
        d.detail.push(format!(
            "IPv4 id={id:#06x} ip_header={}B udp_len={}",
            dg.ip_header.len(),
            dg.payload_len + 8
        ));
    }

    // The BTH can be shown even from a packet that does not parse.
    if let Ok(bth) = roxe_wire::Bth::new_checked(dg.payload) {
        d.opcode = match roxe_wire::Opcode::try_from(bth.opcode_raw()) {
            Ok(op) => op.name().to_string(),
            Err(_) => format!("UNKNOWN_{:#04X}", bth.opcode_raw()),
        };
        d.dest_qp = Some(bth.dest_qp());
        d.psn = Some(bth.psn().value());
        for (on, name) in [
            (bth.solicited(), "SE"),
            (bth.migreq(), "M"),
            (bth.ack_req(), "A"),
            (bth.fecn(), "FECN"),
            (bth.becn(), "BECN"),
        ] {
            if on {
                d.flags.push(name);
            }
        }
        d.detail.push(format!(
            "BTH opcode={:#04x} se={} m={} pad={} tver={} pkey={:#06x} fecn={} becn={} resv6={:#04x} dqp={:#08x} ackreq={} resv7={:#04x} psn={}",
            bth.opcode_raw(), u8::from(bth.solicited()), u8::from(bth.migreq()), bth.pad_count(), bth.tver(),
            bth.pkey(), u8::from(bth.fecn()), u8::from(bth.becn()), bth.resv6(), bth.dest_qp(),
            u8::from(bth.ack_req()), bth.resv7(), bth.psn()
        ));
    } else {
        d.opcode = "TOO_SHORT".into();
    }

    if dg.truncated {
        err(
            &mut d,
            "truncated",
            format!(
                "capture cut the packet ({} of {} bytes): ICRC not checked; capture with -s 0",
                dg.payload.len(),
                dg.payload_len
            ),
        );
        return Some(d);
    }

    match Packet::new_checked(dg.payload) {
        Ok(p) => {
            d.payload_len = Some(p.payload().len());
            match PacketRepr::parse(&p) {
                Ok(r) => {
                    describe_headers(&r, &mut d);
                    describe_cm(&r, &mut d);
                    // A requester may go back and, overtaken by an ACK,
                    // jump ahead again; it may never send a PSN first
                    // before an older one it never sent.
                    if let Some(skip) = s.frontier.see(rec.frame, dg.src, dg.dst, &r) {
                        d.findings.push(Finding {
                            severity: Severity::Warning,
                            kind: "psn-skipped",
                            text: format!(
                                "requester sent PSN {} first, {} PSNs after the highest it had sent ({}); \
                                 they were never sent (or the capture lost them)",
                                skip.got.value(),
                                skip.expected.distance(skip.got),
                                (skip.expected - 1).value()
                            ),
                        });
                    }
                }
                Err(e) => err(&mut d, error_kind(&e), e.to_string()),
            }
            for problem in lint(&p) {
                d.findings.push(Finding {
                    severity: problem.severity(),
                    kind: problem.kind(),
                    text: problem.to_string(),
                });
            }
        }
        Err(e) => err(&mut d, error_kind(&e), e.to_string()),
    }

    if dg.payload.len() >= 16 {
        match dg.check_icrc() {
            Some(Ok(c)) => {
                d.icrc_wire = Some(c.wire);
                d.icrc_expected = Some(c.expected);
                if c.ok() {
                    d.icrc = "OK";
                } else {
                    d.icrc = "BAD";
                    err(
                        &mut d,
                        "icrc",
                        format!(
                            "ICRC mismatch: wire {}, expected {}",
                            hex4(c.wire),
                            hex4(c.expected)
                        ),
                    );
                }
            }
            Some(Err(e)) => err(&mut d, "icrc", format!("ICRC not computable: {e}")),
            None => {}
        }
    }
    Some(d)
}

fn error_kind(e: &WireError) -> &'static str {
    match e {
        WireError::Truncated { .. } => "too-short",
        WireError::UnknownOpcode(_) | WireError::UnsupportedTransport(_) => "opcode",
        WireError::BadVersion(_) => "tver",
        WireError::Unaligned(_) => "length-align",
        WireError::BadPadCount { .. } => "pad",
        WireError::BadPayloadLength { .. } => "payload",
        WireError::ReservedSyndrome(_) => "aeth",
        _ => "malformed",
    }
}

/// The ICRC's wire bytes in order, as roce-check and tshark print them.
fn hex4(icrc: u32) -> String {
    icrc.to_le_bytes().iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn fmt_ip(a: std::net::IpAddr) -> String {
    match a {
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        v4 => v4.to_string(),
    }
}

fn describe_headers(r: &PacketRepr, d: &mut Decoded) {
    let h = &r.ext;
    if let Some(x) = h.deth {
        d.fields.push((
            "DETH".into(),
            format!("qkey={:#010x} src_qp={:#08x}", x.qkey, x.src_qp),
        ));
    }
    if let Some(x) = h.xrceth {
        d.fields.push((
            "XRCETH".into(),
            format!("srq={:#08x}", roxe_wire::ext::xrc_srqn(x)),
        ));
    }
    if let Some(x) = h.feth {
        d.fields.push((
            "FETH".into(),
            format!("sel={} plt={}", x.selectivity_level(), x.placement_type()),
        ));
    }
    if let Some(x) = h.reth {
        d.fields.push((
            "RETH".into(),
            format!("va={:#x} rkey={:#010x} len={}", x.va, x.rkey, x.dma_len),
        ));
    }
    if let Some(x) = h.atomic_eth {
        d.fields.push((
            "AtomicETH".into(),
            format!(
                "va={:#x} rkey={:#010x} swap_add={:#x} compare={:#x}",
                x.va, x.rkey, x.swap_add, x.compare
            ),
        ));
    }
    if let Some(x) = h.aeth {
        d.fields
            .push(("AETH".into(), format!("{} msn={}", x.syndrome, x.msn)));
    }
    if let Some(x) = h.atomic_ack_eth {
        d.fields
            .push(("AtomicAckETH".into(), format!("orig={:#x}", x.orig)));
    }
    if let Some(x) = h.imm_dt {
        d.fields.push(("ImmDt".into(), format!("{x:#010x}")));
    }
    if let Some(x) = h.ieth {
        d.fields.push(("IETH".into(), format!("rkey={x:#010x}")));
    }
}

/// A UD packet to QP1 whose payload is a CM MAD: the message's name and
/// the IDs that tie a connection together.
fn describe_cm(r: &PacketRepr, d: &mut Decoded) {
    if r.bth.dest_qp != cm::GSI_QPN || r.ext.deth.is_none() {
        return;
    }
    let Ok(m) = CmMad::parse(r.payload) else {
        return;
    };
    let h = &m.header;
    d.detail.push(format!(
        "MAD base={} class={:#04x} version={} method={:#04x} status={:#06x} tid={:#018x} attr={:#06x} attr_mod={:#010x}",
        h.base_version, h.mgmt_class, h.class_version, h.method, h.status, h.tid, h.attr_id, h.attr_mod
    ));
    let ids = |local: u32, remote: u32| {
        format!("local_comm_id={local:#010x} remote_comm_id={remote:#010x}")
    };
    let cma = |private_data: &[u8]| {
        rdma_cm::CmaHeader::parse(private_data)
            .map(|c| format!(" cma={}:{}>{}", fmt_ip(c.src), c.port, fmt_ip(c.dst)))
            .unwrap_or_default()
    };
    let mut text = match &m.message {
        CmMessage::Req(q) => format!(
            "local_comm_id={:#010x} service_id={:#018x} qpn={:#08x} psn={:#08x}{}",
            q.local_comm_id,
            q.service_id,
            q.local_qpn,
            q.starting_psn,
            cma(&q.private_data)
        ),
        CmMessage::Rep(p) => format!(
            "{} qpn={:#08x} psn={:#08x}",
            ids(p.local_comm_id, p.remote_comm_id),
            p.local_qpn,
            p.starting_psn
        ),
        CmMessage::Rtu(x) => ids(x.local_comm_id, x.remote_comm_id),
        CmMessage::Rej(x) => format!(
            "reason={} {} {} msg_rejected={}",
            x.reason,
            cm::reject_reason_name(x.reason),
            ids(x.local_comm_id, x.remote_comm_id),
            x.msg_rejected
        ),
        CmMessage::Mra(x) => format!(
            "{} msg_mraed={} service_timeout={}",
            ids(x.local_comm_id, x.remote_comm_id),
            x.msg_mraed,
            x.service_timeout
        ),
        CmMessage::Dreq(x) => format!(
            "{} remote_qpn={:#08x}",
            ids(x.local_comm_id, x.remote_comm_id),
            x.remote_qpn
        ),
        CmMessage::Drep(x) => ids(x.local_comm_id, x.remote_comm_id),
        CmMessage::SidrReq(x) => format!(
            "request_id={:#010x} service_id={:#018x}{}",
            x.request_id,
            x.service_id,
            cma(&x.private_data)
        ),
        CmMessage::SidrRep(x) => format!(
            "request_id={:#010x} status={} qpn={:#08x} qkey={:#010x}",
            x.request_id, x.status, x.qpn, x.qkey
        ),
        CmMessage::Other(_) => format!("attr_id={:#06x}", h.attr_id),
    };
    if h.method != cm::METHOD_SEND {
        let _ = write!(text, " method={:#04x}", h.method);
    }
    d.cm = Some(format!("{}({text})", cm::attr_name(h.attr_id)));
}

pub(crate) fn tally(s: &mut Summary, d: &Decoded) {
    s.roce += 1;
    *s.opcodes.entry(d.opcode.clone()).or_default() += 1;
    match d.icrc {
        "OK" => s.icrc_ok += 1,
        "BAD" => s.icrc_bad += 1,
        _ => s.icrc_unchecked += 1,
    }
    let mut malformed = false;
    for f in &d.findings {
        match f.severity {
            Severity::Error => {
                *s.errors_by_kind.entry(f.kind).or_default() += 1;
                if f.kind == "truncated" {
                    s.truncated += 1;
                } else if f.kind != "icrc" {
                    malformed = true;
                }
            }
            Severity::Warning => *s.warnings_by_kind.entry(f.kind).or_default() += 1,
        }
    }
    if malformed {
        s.malformed += 1;
    }
    if d.opcode == "CNP" {
        s.cnps += 1;
    }
    if d.opcode == "RC_ACKNOWLEDGE" || d.opcode == "RC_ATOMIC_ACKNOWLEDGE" {
        if let Some((_, aeth)) = d.fields.iter().find(|(k, _)| k == "AETH") {
            if aeth.starts_with("ACK") {
                s.acks += 1;
            } else {
                let kind = aeth.split(' ').next().unwrap_or("NAK").to_string();
                *s.naks.entry(kind).or_default() += 1;
            }
        }
    }
}

pub(crate) fn print_packet(
    out: &mut impl std::io::Write,
    d: &Decoded,
    verbose: bool,
) -> std::io::Result<()> {
    let mut line = format!(
        "#{} {}.{:06} {} > {} {}",
        d.frame,
        d.ts_ns / 1_000_000_000,
        (d.ts_ns % 1_000_000_000) / 1000,
        d.src,
        d.dst,
        d.opcode
    );
    if let Some(q) = d.dest_qp {
        let _ = write!(line, " qp={q:#08x}");
    }
    if let Some(p) = d.psn {
        let _ = write!(line, " psn={p}");
    }
    if !d.flags.is_empty() {
        let _ = write!(line, " [{}]", d.flags.join(","));
    }
    for (k, v) in &d.fields {
        let _ = write!(line, " {k}({v})");
    }
    if let Some(n) = d.payload_len {
        let _ = write!(line, " payload={n}");
    }
    let _ = write!(line, " icrc={}", d.icrc);
    if let Some(c) = &d.cm {
        let _ = write!(line, " CM {c}");
    }
    writeln!(out, "{line}")?;
    if verbose {
        for x in &d.detail {
            writeln!(out, "    {x}")?;
        }
        if let (Some(w), Some(e)) = (d.icrc_wire, d.icrc_expected) {
            writeln!(out, "    ICRC wire={} expected={}", hex4(w), hex4(e))?;
        }
    }
    for f in &d.findings {
        if f.severity == Severity::Error || verbose {
            let sev = if f.severity == Severity::Error {
                "ERROR"
            } else {
                "warning"
            };
            writeln!(out, "    {sev} [{}]: {}", f.kind, f.text)?;
        }
    }
    Ok(())
}

pub(crate) fn print_summary(
    out: &mut impl std::io::Write,
    path: &std::path::Path,
    s: &Summary,
) -> std::io::Result<()> {
    writeln!(out, "-- summary of {}", path.display())?;
    writeln!(
        out,
        "frames: {}  RoCEv2 packets: {} (IPv4 {}, IPv6 {})  other frames: {}{}",
        s.frames,
        s.roce,
        s.ipv4,
        s.ipv6,
        s.non_roce_frames,
        if s.rocev1_frames > 0 {
            format!("  RoCEv1 frames (not checked): {}", s.rocev1_frames)
        } else {
            String::new()
        }
    )?;
    let mut ops: Vec<_> = s.opcodes.iter().collect();
    ops.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    writeln!(
        out,
        "opcodes: {}",
        ops.iter()
            .map(|(k, v)| format!("{k} x{v}"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    writeln!(
        out,
        "ICRC: {} ok, {} bad, {} unchecked   malformed: {}   truncated: {}",
        s.icrc_ok, s.icrc_bad, s.icrc_unchecked, s.malformed, s.truncated
    )?;
    if s.acks > 0 || !s.naks.is_empty() {
        writeln!(
            out,
            "ACKs: {}  NAKs: {}",
            s.acks,
            if s.naks.is_empty() {
                "0".to_string()
            } else {
                s.naks
                    .iter()
                    .map(|(k, v)| format!("{k} x{v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )?;
    }
    if s.cnps > 0 {
        writeln!(out, "CNPs: {}", s.cnps)?;
    }
    if !s.errors_by_kind.is_empty() {
        writeln!(out, "errors: {}", kinds(&s.errors_by_kind))?;
    }
    if !s.warnings_by_kind.is_empty() {
        writeln!(out, "warnings: {}", kinds(&s.warnings_by_kind))?;
    }
    writeln!(out, "result: {}", s.result())
}

fn kinds(m: &BTreeMap<&'static str, u64>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} x{v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn packet_json(d: &Decoded) -> Value {
    let mut fields = Map::new();
    for (k, v) in &d.fields {
        fields.insert(k.clone(), Value::String(v.clone()));
    }
    let mut v = json!({
        "frame": d.frame,
        "ts_ns": d.ts_ns,
        "src": d.src,
        "dst": d.dst,
        "opcode": d.opcode,
        "dest_qp": d.dest_qp,
        "psn": d.psn,
        "flags": d.flags,
        "headers": fields,
        "payload_len": d.payload_len,
        "icrc": d.icrc.to_lowercase(),
        "icrc_wire": d.icrc_wire.map(hex4),
        "icrc_expected": d.icrc_expected.map(hex4),
        "problems": d.findings.iter().map(|f| json!({
            "severity": if f.severity == Severity::Error { "error" } else { "warning" },
            "kind": f.kind,
            "text": f.text,
        })).collect::<Vec<_>>(),
    });
    if let (Some(c), Some(obj)) = (&d.cm, v.as_object_mut()) {
        obj.insert("cm".into(), Value::String(c.clone()));
    }
    v
}

fn summary_json(path: &std::path::Path, s: &Summary, packets: Option<Vec<Value>>) -> Value {
    let mut v = json!({
        "file": path.display().to_string(),
        "frames": s.frames,
        "roce_packets": s.roce,
        "ipv4": s.ipv4,
        "ipv6": s.ipv6,
        "other_frames": s.non_roce_frames,
        "rocev1_frames": s.rocev1_frames,
        "opcodes": s.opcodes,
        "icrc": {"ok": s.icrc_ok, "bad": s.icrc_bad, "unchecked": s.icrc_unchecked},
        "malformed": s.malformed,
        "truncated": s.truncated,
        "errors_by_kind": s.errors_by_kind,
        "warnings_by_kind": s.warnings_by_kind,
        "acks": s.acks,
        "naks": s.naks,
        "cnps": s.cnps,
        "udp_checksum": s.udp_checksum,
        "result": s.result(),
        "exit_status": s.status(),
    });
    if let (Some(p), Some(obj)) = (packets, v.as_object_mut()) {
        obj.insert("packets".into(), Value::Array(p));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_ranking() {
        assert_eq!(worse(EXIT_OK, EXIT_EMPTY), EXIT_EMPTY);
        assert_eq!(worse(EXIT_FAIL, EXIT_EMPTY), EXIT_FAIL);
        assert_eq!(worse(EXIT_FAIL, EXIT_UNREADABLE), EXIT_UNREADABLE);
        assert_eq!(hex4(0x2a00fd82), "82fd002a");
    }
}
