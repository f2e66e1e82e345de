//! `roxe plot` as a user runs it: on golden captures and on a capture of a
//! transfer under `ROXE_FAULT`, the SVG is a well-formed document whose
//! marks account for every retransmission and NAK the independent checker
//! (../shared/tools/roce-check) and `roxe decode` count.

use roxe_testnet::CONTROL_HOST;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn roxe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_roxe"))
        .args(args)
        .output()
        .unwrap()
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("roxe-plot-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Plot `capture` and parse the SVG: (marks by class, flows drawn).
fn plot(capture: &Path, svg: &Path) -> (std::collections::HashMap<String, usize>, usize) {
    let out = roxe(&[
        "plot",
        capture.to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "roxe plot {}: {}\n{}",
        capture.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(svg).unwrap();
    let doc = roxmltree::Document::parse(&text)
        .unwrap_or_else(|e| panic!("{}: not well-formed XML: {e}", svg.display()));
    let svg_root = doc.root_element();
    assert_eq!(svg_root.tag_name().name(), "svg");
    assert_eq!(
        svg_root.tag_name().namespace(),
        Some("http://www.w3.org/2000/svg")
    );
    let mut marks = std::collections::HashMap::new();
    let mut flows = 0;
    for n in svg_root.descendants().filter(|n| n.is_element()) {
        if n.attribute("class") == Some("flow") {
            flows += 1;
        }
        // Marks outside the legend; a path of dots counts its dots.
        if n.ancestors()
            .any(|a| a.attribute("class") == Some("legend"))
        {
            continue;
        }
        if let Some(c) = n.attribute("class").filter(|c| *c != "flow") {
            let k = if n.tag_name().name() == "path"
                && n.attribute("d").is_some_and(|d| d.ends_with("h0"))
            {
                n.attribute("d").unwrap().matches('M').count()
            } else {
                1
            };
            *marks.entry(c.to_string()).or_default() += k;
        }
    }
    (marks, flows)
}

fn count(marks: &std::collections::HashMap<String, usize>, class: &str) -> usize {
    marks.get(class).copied().unwrap_or(0)
}

/// roce-check's retransmitted request packets (duplicates included).
fn retransmitted_requests(tool: &Path, capture: &Path) -> u64 {
    let out = Command::new("python3")
        .arg(tool)
        .arg("--json")
        .arg(capture)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["files"][0]["flows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "req")
        .map(|f| f["retransmitted"].as_u64().unwrap())
        .sum()
}

fn decode_json(capture: &Path) -> Value {
    let out = roxe(&["decode", "--json", capture.to_str().unwrap()]);
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["files"][0].clone()
}

#[test]
fn golden_captures_plot_every_response() {
    let golden = root().join("tests/data/golden");
    let mut plotted = 0;
    for e in std::fs::read_dir(&golden).unwrap().flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "pcap") {
            continue;
        }
        let svg = tmp(&format!(
            "{}.svg",
            path.file_stem().unwrap().to_string_lossy()
        ));
        let out = roxe(&["plot", path.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
        if out.status.code() == Some(3) {
            // UD only, or CM MADs only.
            continue;
        }
        let (marks, flows) = plot(&path, &svg);
        assert!(flows >= 1, "{}", path.display());
        let d = decode_json(&path);
        let ops = &d["opcodes"];
        let n = |k: &str| ops[k].as_u64().unwrap_or(0) as usize;
        let read_responses = n("RC_RDMA_READ_RESPONSE_FIRST")
            + n("RC_RDMA_READ_RESPONSE_MIDDLE")
            + n("RC_RDMA_READ_RESPONSE_LAST")
            + n("RC_RDMA_READ_RESPONSE_ONLY");
        // Dots of one pixel are drawn once; golden captures are small.
        assert_eq!(
            count(&marks, "read-response"),
            read_responses,
            "{}",
            path.display()
        );
        let acks = d["acks"].as_u64().unwrap_or(0) as usize;
        assert!(count(&marks, "ack") <= acks, "{}", path.display());
        plotted += 1;
    }
    assert!(plotted >= 5, "only {plotted} golden captures had RC flows");
}

#[test]
fn unreadable_and_empty_captures_fail_with_their_status() {
    let missing = tmp("missing.pcap");
    let out = roxe(&["plot", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.pcap"));
    let ud = root().join("tests/data/golden");
    let ud_only = std::fs::read_dir(&ud)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("ud_send"));
    if let Some(p) = ud_only {
        let out = roxe(&[
            "plot",
            p.to_str().unwrap(),
            "-o",
            tmp("ud.svg").to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(3), "{}", p.display());
    }
}

/// Kills the children still running when a test panics.
struct Reaper(Vec<Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A 64 KiB WRITE stream under loss, duplication and reordering on both
/// sides, captured by the client's device: the plot marks every
/// retransmitted request (as retransmission, duplicate or late arrival)
/// that roce-check counts, and every NAK `roxe decode` counts.
#[test]
fn a_faulted_transfer_shows_every_retransmission_and_nak() {
    let [server_addr, client_addr] = roxe_testnet::addrs();
    let port = roxe_testnet::port().to_string();
    let seed = 7;
    let fault = format!("loss=0.02,dup=0.01,reorder=0.01,seed={seed}");
    eprintln!("server {server_addr}, client {client_addr}, port {port}, ROXE_FAULT={fault}");
    let pcap = tmp("faulted.pcap");
    let spawn = |addr: std::net::Ipv4Addr, role: &[&str], pcap: Option<&Path>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_roxe"));
        c.args(["perf", "write", "-s", "65536", "-n", "200", "-p", &port])
            .args(role)
            .env("ROXE_ADDR", addr.to_string())
            .env("ROXE_FAULT", &fault)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(p) = pcap {
            c.env("ROXE_PCAP", p);
        }
        c.spawn().unwrap()
    };
    let mut reaper = Reaper(vec![spawn(server_addr, &["server"], None)]);
    reaper
        .0
        .push(spawn(client_addr, &["client", CONTROL_HOST], Some(&pcap)));
    let deadline = Instant::now() + Duration::from_secs(60);
    for c in &mut reaper.0 {
        loop {
            match c.try_wait().unwrap() {
                Some(status) => {
                    assert!(status.success(), "roxe perf under {fault}: {status}");
                    break;
                }
                None if Instant::now() >= deadline => panic!("roxe perf still running after 60 s"),
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
    let (marks, flows) = plot(&pcap, &tmp("faulted.svg"));
    assert!(flows >= 1);
    eprintln!("marks: {marks:?}");
    let resent =
        count(&marks, "retransmission") + count(&marks, "duplicate") + count(&marks, "late");
    assert!(
        resent > 0,
        "faults of seed {seed} made no retransmission: {marks:?}"
    );
    let d = decode_json(&pcap);
    let naks: u64 = d["naks"]
        .as_object()
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    assert_eq!(
        (count(&marks, "seq-nak") + count(&marks, "rnr-nak") + count(&marks, "error-nak")) as u64,
        naks,
        "every NAK drawn"
    );
    if let Some(tool) = roxe_testnet::roce_check::tool() {
        assert_eq!(
            resent as u64,
            retransmitted_requests(&tool, &pcap),
            "every retransmitted request drawn"
        );
    }
}

/// `scripts/plot-sweep.py` (the size sweep's SVG, docs/size-sweep.svg):
/// every row of the CSV is a point of both panels, the document parses,
/// and a CSV with no rows is refused.
#[test]
fn the_size_sweep_plot_draws_every_row() {
    let script = root().join("scripts/plot-sweep.py");
    let csv = tmp("sweep.csv");
    let svg = tmp("sweep.svg");
    let mut rows = String::from("op,size,gbytes_per_s,cpu_s_per_gb\n");
    for (k, size) in [64u32, 4096, 65536, 1 << 20].iter().enumerate() {
        for op in ["write", "read", "send", "tcp"] {
            rows += &format!("{op},{size},{},{}\n", 0.5 + k as f64, 40.0 / (k + 1) as f64);
        }
    }
    std::fs::write(&csv, rows).unwrap();
    let run = |csv: &Path| {
        Command::new("python3")
            .arg(&script)
            .arg(csv)
            .arg(&svg)
            .output()
            .expect("python3")
    };
    let out = run(&csv);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
    let points = doc
        .descendants()
        .filter(|n| n.has_tag_name("circle"))
        .count();
    assert_eq!(points, 2 * 16, "16 rows, two panels");
    let lines = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .count();
    assert_eq!(lines, 2 * 4, "one line per operation and panel");
    assert!(text.contains("1 MiB") && text.contains("iperf3 TCP"));
    let empty = tmp("empty.csv");
    std::fs::write(&empty, "op,size,gbytes_per_s,cpu_s_per_gb\n").unwrap();
    assert!(!run(&empty).status.success(), "a CSV with no rows");
}
