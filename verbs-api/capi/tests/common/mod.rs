//! Running unmodified programs over the drop-in `libibverbs.so.1`: where
//! the library is, a directory holding it under its SONAME, per-test
//! loopback addresses and TCP ports, and a server/client pair of child
//! processes with a deadline (killed on every exit path).

#![allow(dead_code)]

use std::ffi::OsString;
use std::io::Read;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long one program (or one server/client pair) may run before it is
/// killed; `ROXE_PROGRAMS_DEADLINE=<secs>` overrides it.
pub fn deadline() -> Duration {
    static D: OnceLock<Duration> = OnceLock::new();
    *D.get_or_init(|| {
        let secs = std::env::var("ROXE_PROGRAMS_DEADLINE")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(45);
        Duration::from_secs(secs)
    })
}

/// Once one side of a pair has failed, how long the other may still run.
const GRACE: Duration = Duration::from_secs(3);

/// `cargo test` does not build a cdylib-only library for integration tests
/// (it is not linkable), so the first call runs `cargo build` for this
/// package into the same target directory and profile; that also keeps a
/// stale library from being checked. Cargo releases its build lock before
/// it runs the test binaries, so the nested build does not block.
pub fn library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(build_library).clone()
}

/// Run `cargo build --quiet --profile <this test's profile> ARGS` into this
/// test binary's target directory (so the tests use what they were built
/// with); returns target/<profile>. `what` names it in a failure.
pub fn cargo_build(args: &[&str], what: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in target/<profile>/deps");
    let target_dir = profile_dir.parent().expect("target/<profile>");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => panic!("bad profile directory {}", profile_dir.display()),
    };
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let status = Command::new(cargo)
        .args(["build", "--quiet", "--profile", profile])
        .args(args)
        .env("CARGO_TARGET_DIR", target_dir)
        .status()
        .expect("run cargo build");
    assert!(status.success(), "cargo build of {what} failed: {status}");
    profile_dir.to_path_buf()
}

fn build_library() -> PathBuf {
    let profile_dir = cargo_build(
        &[
            "--lib",
            "--manifest-path",
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
        ],
        "the cdylib",
    );
    let lib = profile_dir.join("libibverbs.so");
    assert!(
        lib.is_file(),
        "{} not found after cargo build",
        lib.display()
    );
    lib
}

/// This test process's scratch directory: it holds `libibverbs.so.1`
/// (a symlink to [`library`]) for `LD_LIBRARY_PATH`, and per-test
/// subdirectories. Directories of earlier runs whose process is gone are
/// removed.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = std::env::temp_dir();
        const PREFIX: &str = "roxe-ibverbs-programs-";
        if let Ok(entries) = std::fs::read_dir(&tmp) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(pid) = name.strip_prefix(PREFIX) {
                    if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                        let _ = std::fs::remove_dir_all(e.path());
                    }
                }
            }
        }
        let dir = tmp.join(format!("{PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the scratch directory");
        let lib = library()
            .canonicalize()
            .expect("canonicalize the library path");
        for name in ["libibverbs.so.1", "librdmacm.so.1"] {
            std::os::unix::fs::symlink(&lib, dir.join(name)).expect("symlink the library");
        }
        eprintln!(
            "programs: LD_LIBRARY_PATH={} (libibverbs.so.1, librdmacm.so.1 -> {})",
            dir.display(),
            lib.display()
        );
        dir
    })
}

/// A fresh, empty directory for one test's files.
pub fn scratch(test: &str) -> PathBuf {
    let d = lib_dir().join(test);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create a test directory");
    d
}

/// The Debian packages the program tests run (the programs that prove the
/// drop-in: rdma-core's utilities, perftest, rdmacm-utils) and a program
/// of each that shows whether it is installed.
pub const PACKAGES: &[(&str, &str)] = &[
    ("ibverbs-utils", "ibv_rc_pingpong"),
    ("perftest", "ib_send_bw"),
    ("rdmacm-utils", "rping"),
];

fn on_path(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|d| d.join(name).is_file())
}

/// Whether the program tests can run. When a package is missing, outside
/// CI the test is skipped with a line naming the packages
/// (`scripts/test` installs them, or says the same once); under CI
/// (`CI` set) a missing package fails the test: CI installs them.
pub fn programs_installed(test: &str) -> bool {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(_, prog)| !on_path(prog))
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return true;
    }
    let line = format!(
        "{test}: SKIPPED: not installed: {} (apt-get install {})",
        missing.join(", "),
        missing.join(" ")
    );
    assert!(
        std::env::var_os("CI").is_none(),
        "{line} (required under CI)"
    );
    eprintln!("{line}");
    false
}

/// The full path of a program on `PATH`; a clear failure when missing.
pub fn program(name: &str) -> PathBuf {
    if name.contains('/') {
        return PathBuf::from(name);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "{name} is not installed (apt-get install ibverbs-utils perftest \
         libibverbs-dev)"
    )
}

/// The device addresses and TCP ports of one test, leased from
/// `roxe_testnet` on first use (no other test holds them): run `i` of the
/// test puts its server on `server(i)`, its client on `client(i)` and its
/// TCP exchange on `port(i)`.
#[derive(Debug, Default)]
pub struct Net {
    servers: [OnceLock<Ipv4Addr>; Net::RUNS],
    clients: [OnceLock<Ipv4Addr>; Net::RUNS],
    ports: [OnceLock<u16>; Net::RUNS],
}

impl Net {
    const RUNS: usize = 10;

    pub fn new() -> Net {
        Net::default()
    }
    fn leased<T: Copy + std::fmt::Display>(
        cells: &[OnceLock<T>; Net::RUNS],
        i: u16,
        lease: fn() -> T,
        what: &str,
    ) -> T {
        let cell = &cells[usize::from(i)];
        *cell.get_or_init(|| {
            let v = lease();
            eprintln!("run {i}: {what} {v}");
            v
        })
    }
    pub fn server(&self, i: u16) -> String {
        Net::leased(&self.servers, i, roxe_testnet::addr, "server").to_string()
    }
    pub fn client(&self, i: u16) -> String {
        Net::leased(&self.clients, i, roxe_testnet::addr, "client").to_string()
    }
    pub fn port(&self, i: u16) -> u16 {
        Net::leased(&self.ports, i, roxe_testnet::port, "TCP port")
    }
    /// The LID roxe gives the server's / client's device of run `i`
    /// (127.0.x.y -> x * 256 + y).
    pub fn server_lid(&self, i: u16) -> u16 {
        lid_of(Net::leased(&self.servers, i, roxe_testnet::addr, "server"))
    }
    pub fn client_lid(&self, i: u16) -> u16 {
        lid_of(Net::leased(&self.clients, i, roxe_testnet::addr, "client"))
    }
}

fn lid_of(a: Ipv4Addr) -> u16 {
    let [_, _, x, y] = a.octets();
    u16::from_be_bytes([x, y])
}

/// One program invocation: the program, its arguments, its device address
/// (`ROXE_ADDR`) and extra environment.
#[derive(Clone, Debug)]
pub struct Side {
    pub prog: PathBuf,
    pub args: Vec<String>,
    pub addr: String,
    pub env: Vec<(String, OsString)>,
    /// A server that runs until killed (cmtime's): [`run_pair_cm`] stops
    /// it once the client has exited 0.
    pub stops_with_client: bool,
}

impl Side {
    pub fn new(prog: &str, addr: &str, args: &[&str]) -> Side {
        Side {
            prog: program(prog),
            args: args.iter().map(|s| s.to_string()).collect(),
            addr: addr.to_string(),
            env: Vec::new(),
            stops_with_client: false,
        }
    }

    /// See [`Side::stops_with_client`].
    pub fn stops_with_client(mut self) -> Side {
        self.stops_with_client = true;
        self
    }

    pub fn arg(mut self, a: impl Into<String>) -> Side {
        self.args.push(a.into());
        self
    }

    pub fn env(mut self, k: &str, v: impl Into<OsString>) -> Side {
        self.env.push((k.to_string(), v.into()));
        self
    }

    /// The command line as a shell would take it (for messages).
    pub fn shell(&self) -> String {
        let mut s = format!(
            "LD_LIBRARY_PATH={} ROXE_ADDR={}",
            lib_dir().display(),
            self.addr
        );
        for (k, v) in &self.env {
            s += &format!(" {k}={}", v.to_string_lossy());
        }
        s += &format!(" {}", self.prog.display());
        for a in &self.args {
            s += &format!(" {a}");
        }
        s
    }

    fn spawn(&self, who: &str) -> Proc {
        eprintln!("{who}: {}", self.shell());
        let mut cmd = Command::new(&self.prog);
        cmd.args(&self.args)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("ROXE_ADDR", &self.addr)
            .env_remove("ROXE_PCAP")
            .env_remove("ROXE_FAULT")
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a kill reaches whatever it started.
            .process_group(0);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{who}: spawning {}: {e}", self.prog.display()));
        let out = reader(child.stdout.take().expect("piped stdout"));
        let err = reader(child.stderr.take().expect("piped stderr"));
        Proc {
            child,
            out: Some(out),
            err: Some(err),
            cmdline: self.shell(),
            started: Instant::now(),
            ended: None,
        }
    }
}

fn reader(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = r.read_to_end(&mut b);
        String::from_utf8_lossy(&b).into_owned()
    })
}

/// A running child; killed and reaped if dropped before it finished (a
/// panicking test leaves no process behind).
struct Proc {
    child: Child,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
    cmdline: String,
    started: Instant,
    ended: Option<Instant>,
}

impl Proc {
    fn poll(&mut self) -> Option<ExitStatus> {
        let st = self.child.try_wait().expect("try_wait");
        if st.is_some() && self.ended.is_none() {
            self.ended = Some(Instant::now());
        }
        st
    }

    /// SIGKILL the child's process group (the child and anything it
    /// started), then reap the child.
    fn kill_group(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) with a negative pid signals that process
            // group, which the child leads (process_group(0)).
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kill it if it still runs, and collect its output.
    fn collect(mut self, status: Option<ExitStatus>) -> Run {
        let killed = status.is_none();
        if killed {
            self.kill_group();
        }
        let secs = self
            .ended
            .unwrap_or_else(Instant::now)
            .duration_since(self.started)
            .as_secs_f64();
        // Something it started may still hold its stdout/stderr open: wait
        // a little, then kill its process group.
        let until = Instant::now() + GRACE;
        while !(self.out.as_ref().unwrap().is_finished()
            && self.err.as_ref().unwrap().is_finished())
        {
            if Instant::now() >= until {
                self.kill_group();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Run {
            cmdline: std::mem::take(&mut self.cmdline),
            status: if killed { None } else { status },
            killed,
            secs,
            stdout: self.out.take().unwrap().join().unwrap_or_default(),
            stderr: self.err.take().unwrap().join().unwrap_or_default(),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill_group();
        }
    }
}

/// What one program did.
pub struct Run {
    pub cmdline: String,
    pub status: Option<ExitStatus>,
    /// Killed at the deadline (or because the other side had failed).
    pub killed: bool,
    pub secs: f64,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// rping's own teardown race: its main thread frees the event channel
    /// while its CM thread, which it never joins (rdma-core fixed that
    /// later with an eventfd and a join), may still be about to call
    /// `rdma_get_cm_event` on it after the run's DISCONNECTED event. That
    /// call fails (EINVAL here, EBADF over the kernel's librdmacm) and the
    /// thread exits the process with 255 before main exits 0; the run's
    /// work was done, as the client's verified pings show.
    fn rping_teardown_race(&self) -> bool {
        self.cmdline.contains("rping")
            && self.status.and_then(|s| s.code()) == Some(255)
            && self.stderr.contains("DISCONNECT EVENT")
            && self
                .stderr
                .trim_end()
                .ends_with("rdma_get_cm_event: Invalid argument")
    }

    fn not_started(why: &str) -> Run {
        Run {
            cmdline: String::from("(not started)"),
            status: None,
            killed: false,
            secs: 0.0,
            stdout: String::new(),
            stderr: why.to_string(),
        }
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = match (self.status, self.killed) {
            (_, true) => "killed (deadline or the other side failed)".to_string(),
            (Some(s), _) => s.to_string(),
            (None, _) => "not run".to_string(),
        };
        write!(
            f,
            "$ {}\n{status} after {:.2} s\n--- stdout\n{}--- stderr\n{}---",
            self.cmdline, self.secs, self.stdout, self.stderr
        )
    }
}

/// Run one program to its end (bounded by [`deadline`]).
pub fn run_one(side: &Side) -> Run {
    let mut p = side.spawn("run");
    let end = Instant::now() + deadline();
    loop {
        if let Some(s) = p.poll() {
            return p.collect(Some(s));
        }
        if Instant::now() >= end {
            return p.collect(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether something listens on TCP `port` (any address, v4 or v6).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let mut cols = l.split_whitespace();
                let local = cols.nth(1).unwrap_or("");
                let state = cols.nth(1).unwrap_or("");
                local.ends_with(&want) && state == "0A"
            })
        })
    })
}

/// What a server/client pair did.
pub struct Pair {
    pub server: Run,
    pub client: Run,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "=== server\n{:?}\n=== client\n{:?}",
            self.server, self.client
        )
    }
}

impl Pair {
    /// Both exited 0 (or exited in rping's own teardown race after a
    /// finished run: [`Run::rping_teardown_race`]); otherwise fail with
    /// both outputs.
    pub fn assert_ok(&self) {
        let ok = |r: &Run| {
            let raced = r.rping_teardown_race();
            if raced {
                eprintln!("note: {} exited in rping's teardown race", r.cmdline);
            }
            r.ok() || raced
        };
        assert!(
            ok(&self.server) && ok(&self.client),
            "server or client failed:\n{self:?}"
        );
    }

    /// Both stdouts contain `s`.
    pub fn assert_both_contain(&self, s: &str) {
        for r in [&self.server, &self.client] {
            assert!(
                r.stdout.contains(s),
                "no {s:?} in stdout of\n{r:?}\n\n{self:?}"
            );
        }
    }
}

/// Start `server`, wait until it listens on TCP `port` (the port its
/// arguments name), start `client`, and wait for both, all within
/// [`deadline`]. When one side fails the other gets [`GRACE`] to finish,
/// then it is killed.
pub fn run_pair(server: &Side, client: &Side, port: u16) -> Pair {
    run_pair_within(server, client, port, deadline())
}

/// [`run_pair`] with its own deadline (at least [`deadline`]).
pub fn run_pair_within(server: &Side, client: &Side, port: u16, limit: Duration) -> Pair {
    let limit = limit.max(deadline());
    let start = Instant::now();
    let end = start + limit;
    assert!(
        !listening(port),
        "TCP port {port} is already in use: another process listens on it"
    );
    let mut s = server.spawn("server");
    // The pingpongs and perftest do not retry a refused connection: wait
    // for the server's listening socket (without connecting to it).
    loop {
        if listening(port) {
            break;
        }
        if let Some(st) = s.poll() {
            let server = s.collect(Some(st));
            return Pair {
                server,
                client: Run::not_started("the server exited before it listened"),
            };
        }
        if Instant::now() >= end {
            let server = s.collect(None);
            return Pair {
                server,
                client: Run::not_started(&format!(
                    "the server did not listen on TCP port {port} within {limit:?}"
                )),
            };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut c = client.spawn("client");
    let (mut s_st, mut c_st) = (None, None);
    let mut end_s = end;
    let mut end_c = end;
    loop {
        let now = Instant::now();
        if s_st.is_none() {
            s_st = s.poll();
            if s_st.is_some_and(|x: ExitStatus| !x.success()) {
                end_c = end_c.min(now + GRACE);
            }
        }
        if c_st.is_none() {
            c_st = c.poll();
            if c_st.is_some_and(|x: ExitStatus| !x.success()) {
                end_s = end_s.min(now + GRACE);
            }
            if c_st.is_some_and(|x| x.success()) && server.stops_with_client {
                end_s = now;
            }
        }
        let s_done = s_st.is_some() || now >= end_s;
        let c_done = c_st.is_some() || now >= end_c;
        if s_done && c_done {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let pair = Pair {
        server: s.collect(s_st),
        client: c.collect(c_st),
    };
    eprintln!(
        "pair: server {:?} ({:.2} s), client {:?} ({:.2} s), {:.2} s in all",
        pair.server.status,
        pair.server.secs,
        pair.client.status,
        pair.client.secs,
        start.elapsed().as_secs_f64()
    );
    pair
}

/// Whether a roxe device is open at IPv4 `addr` (its UDP port 4791 is
/// bound there).
pub fn roce_bound(addr: &str) -> bool {
    let Ok(ip) = addr.parse::<std::net::Ipv4Addr>() else {
        return false;
    };
    let want = format!("{:08X}:12B7", u32::from_le_bytes(ip.octets()));
    std::fs::read_to_string("/proc/net/udp").is_ok_and(|t| {
        t.lines()
            .skip(1)
            .any(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
    })
}

/// How often [`run_pair_cm`] starts a client whose connection was refused.
pub const CM_ATTEMPTS: u32 = 3;

/// A server/client pair that connect through rdma_cm, whose listen the
/// test cannot see (no kernel socket): wait until the server's device is
/// open at its address, give it a moment to listen, then start the
/// client; a client that fails while the server still waits is started
/// again (at most `attempts` times, each attempt logged), as a refused
/// connection only means it came before the listen. All within `limit`
/// (at least [`deadline`]).
pub fn run_pair_cm(server: &Side, client: &Side, limit: Duration, attempts: u32) -> Pair {
    let limit = limit.max(deadline());
    let start = Instant::now();
    let end = start + limit;
    let mut s = server.spawn("server");
    loop {
        if roce_bound(&server.addr) {
            break;
        }
        if let Some(st) = s.poll() {
            return Pair {
                server: s.collect(Some(st)),
                client: Run::not_started("the server exited before its device opened"),
            };
        }
        if Instant::now() >= end {
            return Pair {
                server: s.collect(None),
                client: Run::not_started("the server's device did not open in time"),
            };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut attempt = 1;
    let mut c = client.spawn("client");
    let (mut s_st, mut c_st) = (None, None);
    let (mut end_s, mut end_c) = (end, end);
    loop {
        let now = Instant::now();
        if s_st.is_none() {
            s_st = s.poll();
            if s_st.is_some_and(|x: ExitStatus| !x.success()) {
                end_c = end_c.min(now + GRACE);
            }
        }
        if c_st.is_none() {
            c_st = c.poll();
            if let Some(st) = c_st.filter(|x| !x.success()) {
                if s_st.is_none() && attempt < attempts && now + GRACE < end {
                    let failed = std::mem::replace(&mut c, client.spawn("client"));
                    eprintln!(
                        "client attempt {attempt} failed ({st}), started again:\n{:?}",
                        failed.collect(Some(st))
                    );
                    attempt += 1;
                    c_st = None;
                    std::thread::sleep(Duration::from_millis(300));
                    continue;
                }
                end_s = end_s.min(now + GRACE);
            }
            if c_st.is_some_and(|x| x.success()) && server.stops_with_client {
                end_s = now;
            }
        }
        let s_done = s_st.is_some() || now >= end_s;
        let c_done = c_st.is_some() || now >= end_c;
        if s_done && c_done {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let pair = Pair {
        server: s.collect(s_st),
        client: c.collect(c_st),
    };
    eprintln!(
        "pair: server {:?} ({:.2} s), client {:?} ({:.2} s, attempt {attempt}), {:.2} s in all",
        pair.server.status,
        pair.server.secs,
        pair.client.status,
        pair.client.secs,
        start.elapsed().as_secs_f64()
    );
    pair
}

/// `cc` on PATH, if there is one.
pub fn c_compiler() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("cc"))
        .find(|p| p.is_file())
}

// ROXE_PCAP captures checked by roce-check

/// The `roce-check` script: `ROXE_ROCE_CHECK`, or shared/tools next to
/// the workspace.
pub fn roce_check() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ROXE_ROCE_CHECK") {
        return Some(PathBuf::from(p));
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        here.join("../../../shared/tools/roce-check"),
        PathBuf::from("/work/shared/tools/roce-check"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// `roce-check --strict -q` on each capture: exit 0, no bad ICRC, nothing
/// malformed. Returns the problems found (empty: all good).
pub fn check_captures(tool: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut problems = Vec::new();
    for f in files {
        // Strict, but for go-backs overtaken by ACKs (`roxe_testnet::roce_check`).
        let (passed, text) = match roxe_testnet::roce_check::strict(tool, f) {
            Ok(t) => (true, t),
            Err(t) => (false, t),
        };
        eprintln!(
            "roce-check --strict -q {}: {}\n{text}",
            f.display(),
            if passed { "pass" } else { "FAIL" }
        );
        let bad_icrc = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("ICRC: "))
            .and_then(|l| l.split(", ").nth(1))
            .map(|b| b.trim_end_matches(" bad").to_string());
        let malformed = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("malformed packets: "))
            .map(|l| l.split(';').next().unwrap_or("").to_string());
        if !passed || bad_icrc.as_deref() != Some("0") || malformed.as_deref() != Some("0") {
            problems.push(format!(
                "python3 {} --strict -q {}: failed (bad ICRC {bad_icrc:?}, malformed {malformed:?})\n{text}",
                tool.display(),
                f.display(),
            ));
        }
    }
    problems
}

/// Run `pair` with ROXE_PCAP on both sides; the capture files.
pub fn captured(
    dir: &Path,
    name: &str,
    run: impl FnOnce(&dyn Fn(Side, &str) -> Side) -> Pair,
) -> (Pair, Vec<PathBuf>) {
    let files = [
        dir.join(format!("{name}-server.pcap")),
        dir.join(format!("{name}-client.pcap")),
    ];
    let f2 = files.clone();
    let with_pcap = move |s: Side, who: &str| {
        let f = if who == "server" { &f2[0] } else { &f2[1] };
        s.env("ROXE_PCAP", f.as_os_str())
    };
    let p = run(&with_pcap);
    for f in &files {
        let len = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        assert!(
            len > 24,
            "{} missing or empty ({len} bytes)\n{p:?}",
            f.display()
        );
    }
    (p, files.to_vec())
}
