//! `roxe stat`: every roxe device of this user's running processes, with
//! its counters and QPs, as `rdma res show qp` and `rdma stat` show kernel
//! devices. Each device answers on its Unix socket (see
//! `roxe_provider::driver::stat`); sockets of processes that are gone are
//! removed on the way.

use roxe_provider::driver::stat::{pid_of, stat_dir};
use serde_json::{json, Map, Value};
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `roxe stat`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// One JSON object on stdout instead of tables.
    #[arg(long)]
    json: bool,
    /// Print again every SECS seconds until interrupted.
    #[arg(long, value_name = "SECS")]
    watch: Option<u64>,
}

/// One record line: its kind and `key=value` fields in order.
type Fields = Vec<(String, String)>;

/// One device's answer.
struct DeviceStat {
    device: Fields,
    qps: Vec<Fields>,
    cqs: Vec<Fields>,
    /// The Communication Manager's counters (QP1).
    cm: Option<Fields>,
}

fn parse_fields(line: &str) -> Option<(&str, Fields)> {
    let mut words = line.split_whitespace();
    let kind = words.next()?;
    let fields = words
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Some((kind, fields))
}

fn parse(answer: &str) -> Option<DeviceStat> {
    let mut dev = None;
    let mut qps = Vec::new();
    let mut cqs = Vec::new();
    let mut cm = None;
    for line in answer.lines() {
        match parse_fields(line) {
            Some(("device", f)) => dev = Some(f),
            Some(("qp", f)) => qps.push(f),
            Some(("cq", f)) => cqs.push(f),
            Some(("cm", f)) => cm = Some(f),
            _ => {}
        }
    }
    Some(DeviceStat {
        device: dev?,
        qps,
        cqs,
        cm,
    })
}

/// Ask every device; remove the sockets nobody answers on.
fn collect() -> Result<Vec<DeviceStat>, String> {
    let dir = stat_dir().map_err(|e| format!("roxe stat: {e}"))?;
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| format!("roxe stat: {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| pid_of(n).is_some())
        .collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let path = dir.join(&name);
        let mut conn = match UnixStream::connect(&path) {
            Ok(c) => c,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                ) =>
            {
                // Its process is gone (or closed the device a moment ago).
                let _ = std::fs::remove_file(&path);
                continue;
            }
            Err(_) => continue,
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let mut answer = String::new();
        if conn.read_to_string(&mut answer).is_ok() {
            if let Some(d) = parse(&answer) {
                out.push(d);
            }
        }
    }
    Ok(out)
}

fn value(v: &str) -> Value {
    match v {
        "true" => json!(true),
        "false" => json!(false),
        _ => v.parse::<u64>().map_or_else(|_| json!(v), |n| json!(n)),
    }
}

/// `drops=reason:n,...` (or `-`) as `{"reason": n, ...}`.
fn drops_value(v: &str) -> Value {
    Value::Object(
        v.split(',')
            .filter_map(|kv| kv.split_once(':'))
            .map(|(k, n)| (k.to_string(), value(n)))
            .collect::<Map<_, _>>(),
    )
}

fn object(fields: &Fields) -> Value {
    Value::Object(
        fields
            .iter()
            .map(|(k, v)| {
                let v = if k == "drops" || k == "refused" {
                    drops_value(v)
                } else {
                    value(v)
                };
                (k.clone(), v)
            })
            .collect::<Map<_, _>>(),
    )
}

fn field<'a>(f: &'a Fields, key: &str) -> &'a str {
    f.iter()
        .find(|(k, _)| k == key)
        .map_or("-", |(_, v)| v.as_str())
}

fn print_tables(devs: &[DeviceStat]) {
    if devs.is_empty() {
        println!("no roxe device is open in a process of this user");
    }
    for d in devs {
        let f = &d.device;
        println!(
            "{} (pid {}): rx {} tx {} retransmits {} timeouts {} probes {} NAKs sent {} RNR NAKs received {} dropped {} ({})",
            field(f, "addr"),
            field(f, "pid"),
            field(f, "rx_packets"),
            field(f, "tx_packets"),
            field(f, "tx_retransmits"),
            field(f, "timeouts"),
            field(f, "probes"),
            field(f, "naks_sent"),
            field(f, "rnr_naks_received"),
            field(f, "rx_dropped"),
            field(f, "drops"),
        );
        if field(f, "slot") != "0" && field(f, "slot") != "-" {
            println!(
                "  shared address: slot {} (QPNs {}0000..{}ffff), misrouted packets dropped {}, probe rounds {}",
                field(f, "slot"),
                format_args!("{:#04x}", field(f, "slot").parse::<u8>().unwrap_or(0)),
                format_args!("{:#04x}", field(f, "slot").parse::<u8>().unwrap_or(0)),
                field(f, "rx_misrouted"),
                field(f, "steering_probes"),
            );
        }
        if let Some(cm) = &d.cm {
            println!(
                "  CM: rx {} tx {} retries {} malformed {} unmatched {} no listener {} backlog full {} refused {}",
                field(cm, "rx_mads"),
                field(cm, "tx_mads"),
                field(cm, "tx_retries"),
                field(cm, "malformed"),
                field(cm, "unmatched"),
                field(cm, "no_listener"),
                field(cm, "backlog_full"),
                field(cm, "refused"),
            );
        }
        if !d.qps.is_empty() {
            println!(
                "  {:>6} {:<4} {:<5} {:<16} {:>8} {:>9} {:>9} {:>9} {:>6} {:>6} {:>10} {:>10} {:>6} {:>6} {:>6} {:>6} {:>6} {:>5} {:>5} {:>6} {:>6} {:>8} {:>6}  drops",
                "qpn", "type", "state", "peer", "dest_qpn", "next_psn", "una", "epsn", "sq", "rq",
                "rx", "tx", "retx", "probes", "fastrx", "holes", "hrx", "naks", "rnr", "held", "missed", "srtt_us", "window"
            );
        }
        for q in &d.qps {
            println!(
                "  {:>6} {:<4} {:<5} {:<16} {:>8} {:>9} {:>9} {:>9} {:>6} {:>6} {:>10} {:>10} {:>6} {:>6} {:>6} {:>6} {:>6} {:>5} {:>5} {:>6} {:>6} {:>8} {:>6}  {}",
                field(q, "qpn"),
                field(q, "type"),
                field(q, "state"),
                field(q, "peer"),
                field(q, "dest_qpn"),
                field(q, "next_psn"),
                field(q, "una"),
                field(q, "epsn"),
                field(q, "send_queue"),
                field(q, "recv_queue"),
                field(q, "rx_packets"),
                field(q, "tx_packets"),
                field(q, "tx_retransmits"),
                field(q, "probes"),
                field(q, "fast_retransmits"),
                field(q, "holes_reported"),
                field(q, "holes_resent"),
                field(q, "naks_sent"),
                field(q, "rnr_naks_received"),
                field(q, "acks_held"),
                field(q, "holds_missed"),
                field(q, "srtt_us"),
                field(q, "loss_window"),
                field(q, "drops"),
            );
        }
        if !d.cqs.is_empty() {
            println!(
                "  {:>6} {:>7} {:>7} {:>4} {:>10}",
                "cq", "depth", "waiting", "qps", "overflowed"
            );
        }
        for c in &d.cqs {
            println!(
                "  {:>6} {:>7} {:>7} {:>4} {:>10}",
                field(c, "id"),
                field(c, "depth"),
                field(c, "waiting"),
                field(c, "qps"),
                field(c, "overflowed"),
            );
        }
    }
}

/// `roxe stat`.
pub fn run(args: &Args) -> ExitCode {
    loop {
        let devs = match collect() {
            Ok(d) => d,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(1);
            }
        };
        if args.json {
            let list: Vec<Value> = devs
                .iter()
                .map(|d| {
                    let mut o = object(&d.device);
                    o["qps"] = Value::Array(d.qps.iter().map(object).collect());
                    o["cqs"] = Value::Array(d.cqs.iter().map(object).collect());
                    if let Some(cm) = &d.cm {
                        o["cm"] = object(cm);
                    }
                    o
                })
                .collect();
            println!("{}", json!({ "devices": list }));
        } else {
            print_tables(&devs);
        }
        match args.watch {
            Some(secs) => {
                std::thread::sleep(Duration::from_secs(secs.max(1)));
                if !args.json {
                    println!();
                }
            }
            None => return ExitCode::SUCCESS,
        }
    }
}
