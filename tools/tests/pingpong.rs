//! `roxe pingpong` as a user runs it: a server and a client process on
//! loopback, each with its own soft device (`ROXE_ADDR`), in the variants
//! ibv_rc_pingpong users run (LID only, -g, -e, -c, sizes and MTUs); its
//! TCP exchange byte for byte against a fake peer; and its failures.
//!
//! Every test has its own device addresses and TCP port (`roxe_testnet`),
//! so the tests run in parallel; every child is killed after a deadline.

use roxe_testnet::CONTROL_HOST;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a child may run before it is killed.
const DEADLINE: Duration = Duration::from_secs(60);

struct Run {
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
    fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status {:?}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

struct Proc {
    child: Child,
    out: JoinHandle<String>,
    err: JoinHandle<String>,
}

fn reader(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// The LID roxe gives the device at `addr` (127.0.x.y: x·256 + y).
fn lid(addr: Ipv4Addr) -> String {
    let [_, _, x, y] = addr.octets();
    format!("{:04x}", u16::from_be_bytes([x, y]))
}

/// `roxe pingpong ARGS` with its device on `addr`.
fn spawn(addr: Ipv4Addr, args: &[&str]) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_roxe"))
        .arg("pingpong")
        .args(args)
        .env("ROXE_ADDR", addr.to_string())
        .env_remove("ROXE_FAULT")
        .env_remove("ROXE_PCAP")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn roxe");
    let out = reader(child.stdout.take().unwrap());
    let err = reader(child.stderr.take().unwrap());
    Proc { child, out, err }
}

/// Wait for the process until `deadline`, then kill it.
fn finish(mut p: Proc, deadline: Instant) -> Run {
    let status = loop {
        match p.child.try_wait().expect("try_wait") {
            Some(s) => break Some(s),
            None if Instant::now() >= deadline => {
                let _ = p.child.kill();
                let _ = p.child.wait();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    Run {
        status,
        stdout: p.out.join().unwrap(),
        stderr: p.err.join().unwrap(),
    }
}

/// The server's and the client's device addresses and what they did.
struct PairRun {
    server_addr: Ipv4Addr,
    client_addr: Ipv4Addr,
    s: Run,
    c: Run,
}

/// Server and client on addresses of their own, their TCP exchange on a
/// port of its own; `server_extra`/`client_extra` after the common `args`.
fn pair(args: &[&str], server_extra: &[&str], client_extra: &[&str]) -> PairRun {
    let [sa, ca] = roxe_testnet::addrs();
    let port = roxe_testnet::port().to_string();
    eprintln!("server {sa}, client {ca}, TCP port {port}");
    let mut s_args = vec!["-p", &port];
    s_args.extend_from_slice(args);
    s_args.extend_from_slice(server_extra);
    let mut c_args = s_args[..2 + args.len()].to_vec();
    c_args.extend_from_slice(client_extra);
    c_args.push(CONTROL_HOST);
    let deadline = Instant::now() + DEADLINE;
    let server = spawn(sa, &s_args);
    let client = spawn(ca, &c_args);
    let c = finish(client, deadline);
    let s = finish(server, deadline);
    PairRun {
        server_addr: sa,
        client_addr: ca,
        s,
        c,
    }
}

/// The value after `key` on the line starting with `line`.
fn field<'a>(out: &'a str, line: &str, key: &str) -> &'a str {
    let l = out
        .lines()
        .find(|l| l.starts_with(line))
        .unwrap_or_else(|| panic!("no {line:?} line in\n{out}"));
    let rest = &l[l.find(key).unwrap_or_else(|| panic!("no {key} in {l}")) + key.len()..];
    rest.split(',').next().unwrap().trim()
}

/// Both exit 0 and print the result lines, and each side's "remote address"
/// is the other's "local address".
fn check_pair(s: &Run, c: &Run, iters: u32, size: u64) {
    assert!(s.ok(), "server failed:\n{s:?}\nclient:\n{c:?}");
    assert!(c.ok(), "client failed:\n{c:?}\nserver:\n{s:?}");
    for r in [s, c] {
        let iters_line = format!("{iters} iters in ");
        assert!(r.stdout.contains(&iters_line), "{r:?}");
        let bytes_line = format!("{} bytes in ", size * u64::from(iters) * 2);
        assert!(r.stdout.contains(&bytes_line), "{r:?}");
        assert!(r.stdout.contains(" Mbit/sec\n"), "{r:?}");
        assert!(r.stdout.contains(" usec/iter\n"), "{r:?}");
        assert!(!r.stdout.contains("invalid data"), "{r:?}");
    }
    for key in ["LID ", "QPN ", "PSN ", "GID "] {
        assert_eq!(
            field(&s.stdout, "  local address:  ", key),
            field(&c.stdout, "  remote address: ", key),
            "{key}\n{s:?}\n{c:?}"
        );
        assert_eq!(
            field(&c.stdout, "  local address:  ", key),
            field(&s.stdout, "  remote address: ", key),
            "{key}\n{s:?}\n{c:?}"
        );
    }
}

#[test]
fn lid_only() {
    let r = pair(&["-n", "200", "-s", "4096"], &[], &[]);
    let (s, c) = (&r.s, &r.c);
    check_pair(s, c, 200, 4096);
    // The LIDs of the two addresses, and no GID (ibv_rc_pingpong without -g).
    let lid_field = |a| format!("0x{}", lid(a));
    assert_eq!(
        field(&s.stdout, "  local address:  ", "LID "),
        lid_field(r.server_addr)
    );
    assert_eq!(
        field(&c.stdout, "  local address:  ", "LID "),
        lid_field(r.client_addr)
    );
    assert_eq!(field(&s.stdout, "  local address:  ", "GID "), "::");
    assert_eq!(field(&s.stdout, "  remote address: ", "GID "), "::");
}

#[test]
fn with_gid_index_0() {
    let r = pair(&["-n", "200", "-s", "4096", "-g", "0"], &[], &[]);
    let (s, c) = (&r.s, &r.c);
    check_pair(s, c, 200, 4096);
    assert_eq!(
        field(&s.stdout, "  local address:  ", "GID "),
        format!("::ffff:{}", r.server_addr)
    );
    assert_eq!(
        field(&s.stdout, "  remote address: ", "GID "),
        format!("::ffff:{}", r.client_addr)
    );
}

#[test]
fn with_events() {
    let PairRun { s, c, .. } = pair(&["-n", "200", "-s", "4096", "-e"], &[], &[]);
    check_pair(&s, &c, 200, 4096);
}

#[test]
fn with_chk() {
    let PairRun { s, c, .. } = pair(&["-n", "200", "-s", "4096", "-c"], &[], &[]);
    check_pair(&s, &c, 200, 4096);
}

#[test]
fn chk_reports_data_the_client_did_not_mark() {
    // Only the server validates; a client without -c sends 0x7b bytes
    // where -c expects the client's marks.
    let PairRun { s, c, .. } = pair(&["-n", "20", "-s", "8192"], &["-c"], &[]);
    assert!(s.ok() && c.ok(), "{s:?}\n{c:?}");
    assert!(s.stdout.contains("invalid data in page 0\n"), "{s:?}");
    assert!(!c.stdout.contains("invalid data"), "{c:?}");
}

#[test]
fn one_byte_messages() {
    let PairRun { s, c, .. } = pair(&["-n", "200", "-s", "1"], &[], &[]);
    check_pair(&s, &c, 200, 1);
}

#[test]
fn large_messages_with_mtu_4096() {
    let PairRun { s, c, .. } = pair(&["-n", "200", "-s", "65536", "-m", "4096"], &[], &[]);
    check_pair(&s, &c, 200, 65536);
}

#[test]
fn events_gid_and_chk_together_with_small_rx_depth() {
    let args = [
        "-n", "300", "-s", "2000", "-m", "512", "-r", "3", "-e", "-g", "0", "-c",
    ];
    let PairRun { s, c, .. } = pair(&args, &[], &[]);
    check_pair(&s, &c, 300, 2000);
}

/// `--stats` prints the device's counters on stderr after the results;
/// without it a successful run prints none.
#[test]
fn stats_prints_device_counters() {
    let PairRun { s, c, .. } = pair(&["-n", "50", "-s", "4096"], &["--stats"], &[]);
    check_pair(&s, &c, 50, 4096);
    let line = s
        .stderr
        .lines()
        .find(|l| l.starts_with("roxe pingpong: roxe0 counters: "))
        .unwrap_or_else(|| panic!("no counters line:\n{s:?}"));
    assert!(line.contains("rx_packets: "), "{line}");
    assert!(!line.contains("rx_packets: 0,"), "{line}");
    assert!(line.contains("tx_retransmits: "), "{line}");
    assert!(!c.stderr.contains("counters:"), "{c:?}");
}

#[test]
fn client_without_server_fails_to_connect() {
    let deadline = Instant::now() + DEADLINE;
    // A leased port: nobody listens there.
    let (addr, port) = (roxe_testnet::addr(), roxe_testnet::port().to_string());
    let c = finish(
        spawn(addr, &["-p", &port, "--timeout", "1", CONTROL_HOST]),
        deadline,
    );
    assert_eq!(c.code(), Some(1), "{c:?}");
    assert!(
        c.stderr
            .contains(&format!("Couldn't connect to {CONTROL_HOST}:{port}\n")),
        "{c:?}"
    );
    assert!(
        c.stdout
            .starts_with(&format!("  local address:  LID 0x{}, QPN 0x", lid(addr))),
        "{c:?}"
    );
}

#[test]
fn server_without_client_times_out() {
    let deadline = Instant::now() + DEADLINE;
    let port = roxe_testnet::port().to_string();
    let s = finish(
        spawn(roxe_testnet::addr(), &["-p", &port, "--timeout", "1"]),
        deadline,
    );
    assert_eq!(s.code(), Some(1), "{s:?}");
    assert!(s.stderr.contains("accept() failed\n"), "{s:?}");
    // A failed run prints the device's counters without --stats.
    assert!(
        s.stderr.contains("roxe pingpong: roxe0 counters: "),
        "{s:?}"
    );
}

#[test]
fn bad_mtu_prints_usage_and_exits_1() {
    let deadline = Instant::now() + DEADLINE;
    let r = finish(spawn(roxe_testnet::addr(), &["-m", "1000"]), deadline);
    assert_eq!(r.code(), Some(1), "{r:?}");
    assert!(r.stdout.starts_with("Usage:\n"), "{r:?}");
}

fn is_hex(b: &[u8]) -> bool {
    b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// The client's side of the TCP exchange, byte for byte, against a fake
/// server; then its first SEND goes to a LID no device has, and the
/// retries run out as rc_pingpong reports it.
#[test]
fn client_wire_exchange_and_retry_exceeded() {
    let listener = TcpListener::bind((CONTROL_HOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let deadline = Instant::now() + DEADLINE;
    // `nobody`: a leased address with no device on it.
    let [addr, nobody] = roxe_testnet::addrs();
    let client = spawn(
        addr,
        &[
            "-p",
            &port,
            "-g",
            "0",
            "--seed",
            "12345",
            "--timeout",
            "10",
            CONTROL_HOST,
        ],
    );
    listener.set_nonblocking(true).unwrap();
    let mut conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("no client: {e}"),
        }
    };
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut msg = [0u8; 52];
    conn.read_exact(&mut msg).unwrap();
    // "%04x:%06x:%06x:%s" + NUL: the device's LID, the PSN of
    // srand48(12345) (483889296 & 0xffffff), the GID ::ffff:<its address>.
    assert_eq!(
        &msg[..5],
        format!("{}:", lid(addr)).as_bytes(),
        "{}",
        String::from_utf8_lossy(&msg)
    );
    assert!(is_hex(&msg[5..11]) && msg[11] == b':');
    assert_eq!(
        &msg[12..19],
        format!("{:06x}:", 483889296 & 0xffffff).as_bytes()
    );
    let gid_hex = format!("00000000000000000000ffff{:08x}", u32::from(addr));
    assert_eq!(&msg[19..51], gid_hex.as_bytes());
    assert_eq!(msg[51], 0);
    // Our answer: a LID with no device behind it, no GID. (The C program's
    // "parse WC failed %d" prints how many completions that poll returned:
    // the SEND's error, maybe with a flushed receive.)
    let answer = format!("{}:000011:000064:{:032}\0", lid(nobody), 0);
    conn.write_all(answer.as_bytes()).unwrap();
    let mut done = Vec::new();
    conn.read_to_end(&mut done).unwrap();
    assert_eq!(done, b"done\0");
    let c = finish(client, deadline);
    assert_eq!(c.code(), Some(1), "{c:?}");
    assert!(
        c.stdout.contains(&format!(
            "  remote address: LID 0x{}, QPN 0x000011, PSN 0x000064, GID ::\n",
            lid(nobody)
        )),
        "{c:?}"
    );
    assert!(
        c.stderr.contains(
            "Failed status transport retry counter exceeded (12) for wr_id 2\nparse WC failed "
        ),
        "{c:?}"
    );
}

/// The server's side: it reads the client's 52 bytes, answers with its own
/// and expects "done" with its NUL.
#[test]
fn server_wire_exchange() {
    let deadline = Instant::now() + DEADLINE;
    let [addr, nobody] = roxe_testnet::addrs();
    let port = roxe_testnet::port();
    let server = spawn(
        addr,
        &["-p", &port.to_string(), "--seed", "0", "--timeout", "3"],
    );
    let mut conn = loop {
        match std::net::TcpStream::connect((CONTROL_HOST, port)) {
            Ok(c) => break c,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("no server: {e}"),
        }
    };
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let hello = format!("{}:000011:000064:{:032}\0", lid(nobody), 0);
    conn.write_all(hello.as_bytes()).unwrap();
    let mut msg = [0u8; 52];
    conn.read_exact(&mut msg).unwrap();
    assert_eq!(
        &msg[..5],
        format!("{}:", lid(addr)).as_bytes(),
        "{}",
        String::from_utf8_lossy(&msg)
    );
    assert!(is_hex(&msg[5..11]) && msg[11] == b':');
    // srand48(0): the first lrand48() is 366850414.
    assert_eq!(
        &msg[12..19],
        format!("{:06x}:", 366850414 & 0xffffff).as_bytes()
    );
    assert_eq!(&msg[19..], b"00000000000000000000000000000000\0");
    conn.write_all(b"done\0").unwrap();
    drop(conn);
    // Nobody sends: the server's wait for a completion is bounded.
    let s = finish(server, deadline);
    assert_eq!(s.code(), Some(1), "{s:?}");
    assert!(
        s.stdout.contains(&format!(
            "  remote address: LID 0x{}, QPN 0x000011, PSN 0x000064, GID ::\n",
            lid(nobody)
        )),
        "{s:?}"
    );
}
