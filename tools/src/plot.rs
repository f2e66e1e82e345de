//! `roxe plot`: PSN against time per request flow of a capture, as an SVG
//! a browser opens (what Wireshark's stream graph does for TCP).
//!
//! A request flow is (requester, responder, the responder's QP) for RC, UC
//! and XRC. Each of its packets is classified against the flow's
//! *frontier* (the highest PSN seen so far):
//! - next after the frontier: a first send;
//! - beyond it: arrived ahead of PSNs not seen yet (out of order, or the
//!   capture lost them);
//! - at or below it: a PSN never seen before arrived late (out of order);
//!   one seen before is a retransmission, or a duplicate when it repeats
//!   the packet just before it.
//!
//! Responses (ACK, sequence NAK, RNR NAK, other NAKs, READ responses) are
//! drawn on the request flow whose PSNs they answer: the flow from the
//! response's destination to its source nearest in PSN.

use clap::Args as ClapArgs;
use roxe_wire::opcode::{Operation, Transport};
use roxe_wire::pcap::{self, CaptureReader, L3};
use roxe_wire::{AethSyndrome, NakCode, PacketRepr, Psn};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit status: a file that cannot be read or written.
const EXIT_UNREADABLE: u8 = 2;
/// Exit status: no RC/UC/XRC request in the capture.
const EXIT_EMPTY: u8 = 3;

#[derive(ClapArgs)]
pub struct Args {
    /// Capture file (pcap or pcapng): ROXE_PCAP, `roxe capture -w`, tcpdump.
    #[arg(value_name = "CAPTURE")]
    capture: PathBuf,
    /// The SVG to write (default: CAPTURE with the extension .svg).
    #[arg(short, long, value_name = "FILE.svg")]
    output: Option<PathBuf>,
    /// Only flows to this destination QP (hex with 0x, or decimal); repeat
    /// for several.
    #[arg(long, value_name = "QPN", value_parser = parse_qpn)]
    qp: Vec<u32>,
    /// Draw at most this many flows, those with the most packets.
    #[arg(long, default_value_t = 8, value_name = "N")]
    max_flows: usize,
    /// Treat this UDP destination port as RoCEv2 too (4791 always is).
    #[arg(long, value_name = "PORT")]
    port: Vec<u16>,
}

fn parse_qpn(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s}: {e}"))?;
    if v > 0xFF_FFFF {
        return Err(format!("{s}: a QPN has 24 bits"));
    }
    Ok(v)
}

/// What a drawn point is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Mark {
    /// A request PSN sent for the first time, in order.
    Sent,
    /// A request PSN seen before, sent again.
    Retransmission,
    /// The same request PSN as the packet just before it.
    Duplicate,
    /// A request PSN never seen before, below the frontier: out of order.
    Late,
    /// A request PSN beyond the frontier + 1: PSNs before it not seen yet.
    Ahead,
    /// ACK (or atomic ACK).
    Ack,
    /// NAK: PSN sequence error.
    SeqNak,
    /// RNR NAK.
    RnrNak,
    /// NAK: invalid request, remote access or operational error.
    ErrorNak,
    /// RDMA READ response.
    ReadResponse,
}

impl Mark {
    pub(crate) const ALL: [Mark; 10] = [
        Mark::Sent,
        Mark::Retransmission,
        Mark::Duplicate,
        Mark::Late,
        Mark::Ahead,
        Mark::Ack,
        Mark::SeqNak,
        Mark::RnrNak,
        Mark::ErrorNak,
        Mark::ReadResponse,
    ];

    /// The SVG class of the mark (the test counts elements by it).
    pub(crate) fn class(self) -> &'static str {
        match self {
            Mark::Sent => "sent",
            Mark::Retransmission => "retransmission",
            Mark::Duplicate => "duplicate",
            Mark::Late => "late",
            Mark::Ahead => "ahead",
            Mark::Ack => "ack",
            Mark::SeqNak => "seq-nak",
            Mark::RnrNak => "rnr-nak",
            Mark::ErrorNak => "error-nak",
            Mark::ReadResponse => "read-response",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Mark::Sent => "first send",
            Mark::Retransmission => "retransmission",
            Mark::Duplicate => "duplicate",
            Mark::Late => "late (out of order)",
            Mark::Ahead => "ahead of a gap",
            Mark::Ack => "ACK",
            Mark::SeqNak => "sequence NAK",
            Mark::RnrNak => "RNR NAK",
            Mark::ErrorNak => "error NAK",
            Mark::ReadResponse => "READ response",
        }
    }

    fn color(self) -> &'static str {
        match self {
            Mark::Sent => "#1f4e9c",
            Mark::Retransmission => "#d62728",
            Mark::Duplicate => "#9467bd",
            Mark::Late => "#e377c2",
            Mark::Ahead => "#8c564b",
            Mark::Ack => "#2ca02c",
            Mark::SeqNak => "#ff7f0e",
            Mark::RnrNak => "#17becf",
            Mark::ErrorNak => "#000000",
            Mark::ReadResponse => "#7fa7e0",
        }
    }

    fn is_request(self) -> bool {
        matches!(
            self,
            Mark::Sent | Mark::Retransmission | Mark::Duplicate | Mark::Late | Mark::Ahead
        )
    }
}

/// One drawn point: capture time, PSN relative to the flow's first, mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Point {
    pub ts_ns: u64,
    pub psn: i64,
    pub mark: Mark,
    pub frame: u64,
}

/// The PSNs of one request flow, classified.
#[derive(Debug)]
pub(crate) struct Flow {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub dest_qp: u32,
    /// The first PSN seen; `Point::psn` counts from it.
    pub base: Psn,
    /// The highest PSN seen (relative), and as a PSN.
    frontier: i64,
    frontier_psn: Psn,
    /// PSNs a READ request at the frontier may still consume.
    slack: i64,
    last: i64,
    seen: HashSet<i64>,
    pub points: Vec<Point>,
}

impl Flow {
    fn new(src: IpAddr, dst: IpAddr, dest_qp: u32, psn: Psn) -> Self {
        Flow {
            src,
            dst,
            dest_qp,
            base: psn,
            frontier: -1,
            frontier_psn: psn - 1,
            slack: 0,
            last: -1,
            seen: HashSet::new(),
            points: Vec::new(),
        }
    }

    /// `psn` relative to the base, unwrapped near the frontier.
    fn offset(&self, psn: Psn) -> i64 {
        self.frontier + i64::from(self.frontier_psn.distance(psn))
    }

    /// A request packet: its mark. `slack` is how many more PSNs it may
    /// consume (a READ's responses).
    fn request(&mut self, ts_ns: u64, frame: u64, psn: Psn, slack: i64) -> Mark {
        let o = self.offset(psn);
        let mark = if o > self.frontier {
            let mark = if o <= self.frontier + 1 + self.slack {
                Mark::Sent
            } else {
                Mark::Ahead
            };
            self.frontier = o;
            self.frontier_psn = psn;
            self.slack = slack;
            mark
        } else if !self.seen.contains(&o) {
            Mark::Late
        } else if o == self.last {
            Mark::Duplicate
        } else {
            Mark::Retransmission
        };
        self.seen.insert(o);
        self.last = o;
        self.points.push(Point {
            ts_ns,
            psn: o,
            mark,
            frame,
        });
        mark
    }

    fn response(&mut self, ts_ns: u64, frame: u64, psn: Psn, mark: Mark) {
        let o = self.offset(psn);
        self.points.push(Point {
            ts_ns,
            psn: o,
            mark,
            frame,
        });
    }

    pub(crate) fn count(&self, mark: Mark) -> usize {
        self.points.iter().filter(|p| p.mark == mark).count()
    }

    fn requests(&self) -> usize {
        self.points.iter().filter(|p| p.mark.is_request()).count()
    }
}

/// Every request flow of a capture, with its responses.
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    pub flows: Vec<Flow>,
    index: HashMap<(IpAddr, IpAddr, u32), usize>,
    /// The flows from each requester to each responder, for responses.
    between: HashMap<(IpAddr, IpAddr), Vec<usize>>,
    /// Responses no request flow of the capture answers.
    pub unmatched_responses: u64,
    /// The earliest capture time (captures need not be in time order).
    pub start_ts: Option<u64>,
}

/// A response's distance in PSNs beyond which it answers another flow.
const RESPONSE_REACH: i64 = 1 << 20;

impl Timeline {
    /// One RoCEv2 packet from `src` to `dst`.
    pub(crate) fn add(
        &mut self,
        ts_ns: u64,
        frame: u64,
        src: IpAddr,
        dst: IpAddr,
        p: &PacketRepr<'_>,
    ) {
        let op = p.bth.opcode;
        if !matches!(
            op.transport(),
            Transport::Rc | Transport::Uc | Transport::Xrc
        ) {
            return;
        }
        self.start_ts = Some(self.start_ts.map_or(ts_ns, |t| t.min(ts_ns)));
        let psn = p.bth.psn;
        if !op.is_response() {
            let slack = match (op.operation(), p.ext.reth) {
                // With the path MTU unknown a READ may take one PSN per
                // 256 bytes.
                (Operation::ReadRequest, Some(r)) => i64::from(r.dma_len.div_ceil(256).max(1)) - 1,
                _ => 0,
            };
            let key = (src, dst, p.bth.dest_qp);
            let i = *self.index.entry(key).or_insert_with(|| {
                self.flows.push(Flow::new(src, dst, p.bth.dest_qp, psn));
                let i = self.flows.len() - 1;
                self.between.entry((src, dst)).or_default().push(i);
                i
            });
            self.flows[i].request(ts_ns, frame, psn, slack);
            return;
        }
        let mark = match op.operation() {
            Operation::ReadResponse => Mark::ReadResponse,
            Operation::AtomicAcknowledge => Mark::Ack,
            _ => match p.ext.aeth.map(|a| a.syndrome) {
                Some(AethSyndrome::Ack { .. }) => Mark::Ack,
                Some(AethSyndrome::RnrNak(_)) => Mark::RnrNak,
                Some(AethSyndrome::Nak(NakCode::PsnSequenceError)) => Mark::SeqNak,
                Some(AethSyndrome::Nak(_)) => Mark::ErrorNak,
                None => return,
            },
        };
        // The request flow in the other direction nearest in PSN.
        let candidates = self.between.get(&(dst, src)).map_or(&[][..], |v| &v[..]);
        let best = candidates
            .iter()
            .map(|&i| {
                (
                    i,
                    (self.flows[i].offset(psn) - self.flows[i].frontier).abs(),
                )
            })
            .filter(|&(_, d)| d < RESPONSE_REACH)
            .min_by_key(|&(_, d)| d);
        match best {
            Some((i, _)) => self.flows[i].response(ts_ns, frame, psn, mark),
            None => self.unmatched_responses += 1,
        }
    }
}

/// Read `capture` into a timeline.
pub(crate) fn timeline_of(capture: impl std::io::Read, ports: &[u16]) -> Result<Timeline, String> {
    let mut t = Timeline::default();
    for rec in CaptureReader::new(capture).map_err(|e| e.to_string())? {
        let rec = rec.map_err(|e| e.to_string())?;
        let Some(L3::Ipv4(ip) | L3::Ipv6(ip)) = pcap::link_payload(rec.link, &rec.data) else {
            continue;
        };
        let Ok(dg) = roxe_wire::frame::Datagram::parse(ip) else {
            continue;
        };
        if dg.dst_port != roxe_wire::ROCEV2_PORT && !ports.contains(&dg.dst_port) {
            continue;
        }
        if let Ok(p) = PacketRepr::parse_bytes(dg.payload) {
            t.add(rec.ts_ns, rec.frame, dg.src, dg.dst, &p);
        }
    }
    Ok(t)
}

pub fn run(args: &Args) -> ExitCode {
    let file = match std::fs::File::open(&args.capture) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("roxe plot: {}: {e}", args.capture.display());
            return ExitCode::from(EXIT_UNREADABLE);
        }
    };
    let mut t = match timeline_of(std::io::BufReader::new(file), &args.port) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("roxe plot: {}: {e}", args.capture.display());
            return ExitCode::from(EXIT_UNREADABLE);
        }
    };
    if !args.qp.is_empty() {
        t.flows.retain(|f| args.qp.contains(&f.dest_qp));
    }
    if t.flows.is_empty() {
        eprintln!(
            "roxe plot: {}: no RC, UC or XRC request{}",
            args.capture.display(),
            if args.qp.is_empty() {
                ""
            } else {
                " to the QPs given"
            }
        );
        return ExitCode::from(EXIT_EMPTY);
    }
    t.flows.sort_by_key(|f| std::cmp::Reverse(f.points.len()));
    let total = t.flows.len();
    t.flows.truncate(args.max_flows.max(1));
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| args.capture.with_extension("svg"));
    let title = args
        .capture
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let svg = render(&t, &title);
    if let Err(e) = std::fs::write(&out, svg) {
        eprintln!("roxe plot: {}: {e}", out.display());
        return ExitCode::from(EXIT_UNREADABLE);
    }
    for f in &t.flows {
        println!("{}", flow_summary(f));
    }
    if total > t.flows.len() {
        println!(
            "({} more flows not drawn; --max-flows or --qp choose)",
            total - t.flows.len()
        );
    }
    if t.unmatched_responses > 0 {
        println!(
            "({} responses answer no request in the capture)",
            t.unmatched_responses
        );
    }
    println!("wrote {}", out.display());
    ExitCode::SUCCESS
}

fn flow_summary(f: &Flow) -> String {
    let mut s = format!(
        "{} > {} QP {:#08x}: {} requests",
        f.src,
        f.dst,
        f.dest_qp,
        f.requests()
    );
    for m in Mark::ALL.into_iter().skip(1) {
        let n = f.count(m);
        if n > 0 {
            let _ = write!(s, ", {n} {}", m.label());
        }
    }
    s
}

const WIDTH: f64 = 1000.0;
const PANEL: f64 = 300.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 38.0;
const BOTTOM: f64 = 40.0;
const LEGEND: f64 = 62.0;

/// The SVG document for the flows of `t`.
pub(crate) fn render(t: &Timeline, title: &str) -> String {
    let height = LEGEND + PANEL * t.flows.len() as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, "<title>PSN against time: {}</title>", xml(title));
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    // Legend.
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="16" font-size="14" font-weight="bold">PSN against time: {}</text>"#,
        xml(title)
    );
    // Two rows of five, in columns.
    for (i, m) in Mark::ALL.into_iter().enumerate() {
        let x = LEFT + 170.0 * (i % 5) as f64;
        let y = 36.0 + 16.0 * (i / 5) as f64;
        let _ = writeln!(
            s,
            r#"<g class="legend">{}<text x="{:.1}" y="{:.1}">{}</text></g>"#,
            glyph(m, x + 4.0, y - 4.0, ""),
            x + 12.0,
            y,
            m.label()
        );
    }
    let t0 = t.start_ts.unwrap_or(0);
    for (i, f) in t.flows.iter().enumerate() {
        panel(&mut s, f, t0, LEGEND + PANEL * i as f64);
    }
    s.push_str("</svg>\n");
    s
}

fn panel(s: &mut String, f: &Flow, t0: u64, y0: f64) {
    let (tmin, tmax) = f
        .points
        .iter()
        .fold((u64::MAX, 0), |(a, b), p| (a.min(p.ts_ns), b.max(p.ts_ns)));
    let (pmin, pmax) = f.points.iter().fold((i64::MAX, i64::MIN), |(a, b), p| {
        (a.min(p.psn), b.max(p.psn))
    });
    let (t_lo, t_hi) = ((tmin - t0) as f64 / 1e6, (tmax - t0) as f64 / 1e6);
    let (t_lo, t_hi) = if t_hi > t_lo {
        (t_lo, t_hi)
    } else {
        (t_lo - 0.5, t_lo + 0.5)
    };
    let (p_lo, p_hi) = if pmax > pmin {
        (pmin as f64, pmax as f64)
    } else {
        (pmin as f64 - 1.0, pmin as f64 + 1.0)
    };
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = PANEL - TOP - BOTTOM;
    let top = y0 + TOP;
    let sx = |ms: f64| LEFT + (ms - t_lo) / (t_hi - t_lo) * plot_w;
    let sy = |psn: f64| top + plot_h - (psn - p_lo) / (p_hi - p_lo) * plot_h;
    let _ = writeln!(
        s,
        r#"<g class="flow" data-src="{}" data-dst="{}" data-qp="{:#08x}">"#,
        f.src, f.dst, f.dest_qp
    );
    let summary = flow_summary(f);
    let (head, counts) = summary.split_once(": ").unwrap_or((&summary, ""));
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="{:.1}" font-weight="bold">{}</text><text x="{LEFT}" y="{:.1}">{}</text>"#,
        y0 + 16.0,
        xml(head),
        y0 + 31.0,
        xml(counts)
    );
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{top:.1}" width="{plot_w:.1}" height="{plot_h:.1}" fill="none" stroke="#888"/>"##
    );
    // Axes: time in ms since the capture's first packet, PSN since the
    // flow's first.
    for v in ticks(t_lo, t_hi) {
        let x = sx(v);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            top,
            top + plot_h,
            top + plot_h + 16.0,
            fmt_tick(v)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">time (ms since the capture began)</text>"#,
        LEFT + plot_w / 2.0,
        top + plot_h + 32.0
    );
    for v in ticks(p_lo, p_hi) {
        let y = sy(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            fmt_tick(v)
        );
    }
    let _ = writeln!(
        s,
        r#"<text transform="translate(14 {:.1}) rotate(-90)" text-anchor="middle">PSN − {}</text>"#,
        top + plot_h / 2.0,
        f.base.value()
    );
    let at = |p: &Point| (sx((p.ts_ns - t0) as f64 / 1e6), sy(p.psn as f64));
    // First sends and ACKs are the bulk: one path each, one dot per pixel.
    for m in [Mark::Sent, Mark::Ack, Mark::ReadResponse] {
        let mut seen = HashSet::new();
        let mut d = String::new();
        for p in f.points.iter().filter(|p| p.mark == m) {
            let (x, y) = at(p);
            if seen.insert(((x * 2.0) as i64, (y * 2.0) as i64)) {
                let _ = write!(d, "M{x:.1} {y:.1}h0");
            }
        }
        if !d.is_empty() {
            let _ = writeln!(
                s,
                r#"<path class="{}" d="{d}" stroke="{}" stroke-width="{}" stroke-linecap="round"/>"#,
                m.class(),
                m.color(),
                if m == Mark::Sent { 2.5 } else { 2.0 }
            );
        }
    }
    // Every other event is drawn on its own, with its frame on hover.
    for p in f
        .points
        .iter()
        .filter(|p| !matches!(p.mark, Mark::Sent | Mark::Ack | Mark::ReadResponse))
    {
        let (x, y) = at(p);
        let tip = format!(
            "frame {} PSN {} {}",
            p.frame,
            (f.base + (p.psn.rem_euclid(1 << 24) as u32)).value(),
            p.mark.label()
        );
        let _ = writeln!(s, "{}", glyph(p.mark, x, y, &tip));
    }
    s.push_str("</g>\n");
}

/// One mark's symbol at (x, y), with a tooltip.
fn glyph(m: Mark, x: f64, y: f64, tip: &str) -> String {
    let c = m.color();
    let class = m.class();
    let title = if tip.is_empty() {
        String::new()
    } else {
        format!("<title>{}</title>", xml(tip))
    };
    match m {
        Mark::Retransmission => format!(
            r#"<path class="{class}" d="M{:.1} {:.1}l6 6m0 -6l-6 6" stroke="{c}" stroke-width="1.6">{title}</path>"#,
            x - 3.0,
            y - 3.0
        ),
        Mark::SeqNak | Mark::RnrNak | Mark::ErrorNak => format!(
            r#"<path class="{class}" d="M{x:.1} {:.1}l5 8h-10z" fill="{c}">{title}</path>"#,
            y - 5.0
        ),
        Mark::Duplicate | Mark::Late | Mark::Ahead => format!(
            r#"<rect class="{class}" x="{:.1}" y="{:.1}" width="6" height="6" fill="none" stroke="{c}" stroke-width="1.4">{title}</rect>"#,
            x - 3.0,
            y - 3.0
        ),
        Mark::Sent | Mark::Ack | Mark::ReadResponse => format!(
            r#"<circle class="{class}" cx="{x:.1}" cy="{y:.1}" r="3" fill="{c}">{title}</circle>"#
        ),
    }
}

/// About six round tick values covering [lo, hi].
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = hi - lo;
    let raw = span / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|k| k * mag)
        .find(|&st| st >= raw)
        .unwrap_or(10.0 * mag);
    let mut v = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while v <= hi + step * 1e-9 && out.len() < 20 {
        out.push(v);
        v += step;
    }
    out
}

fn fmt_tick(v: f64) -> String {
    if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow() -> Flow {
        Flow::new(
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            0x11,
            Psn::new(0xFF_FFF0),
        )
    }

    #[test]
    fn requests_are_classified_against_the_frontier() {
        let mut f = flow();
        let base = Psn::new(0xFF_FFF0);
        let mut see = |off: u32| f.request(0, 0, base + off, 0);
        // 0..=9 in order (across the 24-bit wrap).
        for o in 0..10 {
            assert_eq!(see(o), Mark::Sent);
        }
        // Go back to 5: retransmissions, the second 7 a duplicate.
        assert_eq!(see(5), Mark::Retransmission);
        assert_eq!(see(6), Mark::Retransmission);
        assert_eq!(see(7), Mark::Retransmission);
        assert_eq!(see(7), Mark::Duplicate);
        // 12 before 10 and 11: ahead; then 10 and 11 arrive late.
        assert_eq!(see(12), Mark::Ahead);
        assert_eq!(see(10), Mark::Late);
        assert_eq!(see(11), Mark::Late);
        assert_eq!(see(13), Mark::Sent);
        assert_eq!(f.points.last().unwrap().psn, 13);
    }

    #[test]
    fn a_read_request_makes_room_for_its_responses() {
        let mut f = flow();
        let base = f.base;
        assert_eq!(f.request(0, 0, base, 3), Mark::Sent); // READ, up to 4 PSNs
        assert_eq!(f.request(0, 0, base + 2, 0), Mark::Sent); // it took 2
        assert_eq!(f.request(0, 0, base + 4, 0), Mark::Ahead);
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let t = ticks(0.013, 0.9);
        assert!(t.len() >= 4 && t.len() <= 10, "{t:?}");
        assert!(t[0] >= 0.013 && *t.last().unwrap() <= 0.9);
        assert_eq!(fmt_tick(0.2), "0.2");
        assert_eq!(parse_qpn("0x12"), Ok(0x12));
        assert!(parse_qpn("0x1000000").is_err());
    }
}
