//! The RDMA stacks people run, over roxe through `roxe run`: the devices
//! where the kernel shows them (/sys/class/infiniband*, /dev/infiniband),
//! UCX (UCT and UCP, between two processes, and UCP connecting by IP
//! address through rdma_cm), Open MPI over UCX, and libfabric's verbs
//! provider (MSG and RDM endpoints, in a network namespace of the test's
//! with a veth pair: libfabric never uses the interface `lo`). Captures of
//! each stack's traffic pass `roce-check --strict`.
//!
//! The programs come from Debian's packages (ucx-utils, libucx-dev,
//! openmpi-bin, libopenmpi-dev, libfabric-bin; `scripts/test` installs them
//! as root): a missing one skips its test with a line saying so, and fails
//! it under CI.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const ROXE: &str = env!("CARGO_BIN_EXE_roxe");
/// How long one program may run.
const LIMIT: Duration = Duration::from_secs(90);

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| v == "true" || v == "1")
}

fn on_path(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|d| d.join(name).is_file())
}

/// Whether `programs` are installed; otherwise a line naming `package`
/// (a failure under CI, which installs it).
fn installed(test: &str, package: &str, programs: &[&str]) -> bool {
    let missing: Vec<&str> = programs.iter().copied().filter(|p| !on_path(p)).collect();
    if missing.is_empty() {
        return true;
    }
    let line = format!(
        "{test}: SKIPPED: {} not installed (apt-get install {package})",
        missing.join(", ")
    );
    assert!(!in_ci(), "{line} (required under CI)");
    eprintln!("{line}");
    false
}

/// The drop-in library, built into this test's target directory (cargo
/// does not build a cdylib for another package's tests), so `roxe run`
/// finds it beside the `roxe` binary.
fn dropin_built() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().and_then(Path::parent).unwrap();
        let target = profile_dir.parent().unwrap();
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev".to_string(),
            Some(p) => p.to_string(),
            None => panic!("no profile directory"),
        };
        let status = Command::new(option_env!("CARGO").unwrap_or("cargo"))
            .args([
                "build",
                "--quiet",
                "-p",
                "roxe-ibverbs",
                "-p",
                "roxe-view-preload",
                "--profile",
                &profile,
            ])
            .env("CARGO_TARGET_DIR", target)
            .status()
            .expect("run cargo build");
        assert!(
            status.success(),
            "cargo build -p roxe-ibverbs -p roxe-view-preload: {status}"
        );
        assert!(
            Path::new(ROXE).with_file_name("libibverbs.so").is_file(),
            "no libibverbs.so beside {ROXE}"
        );
    });
}

/// `roxe run -q [env] -- PROGRAM ARGS` with `ROXE_ADDR=addr`.
fn run_cmd(addr: &str, env: &[(&str, &str)], program: &str, args: &[&str]) -> Command {
    dropin_built();
    let mut c = Command::new(ROXE);
    c.args(["run", "-q", "--", program])
        .args(args)
        .env("ROXE_ADDR", addr)
        .env_remove("ROXE_PCAP")
        .env_remove("ROXE_FAULT")
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Wait for `child` at most [`LIMIT`]; killed past it.
fn finish(mut child: Child, what: &str) -> Output {
    let end = Instant::now() + LIMIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let report = hang_report(child.id());
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: still running after {LIMIT:?}, killed:\n{}\n--- at the timeout\n{report}",
                text(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// What a hung run was doing: `roxe stat` (every open roxe device of
/// this user) and, with gdb installed, the threads' stacks of every
/// process under `root`.
fn hang_report(root: u32) -> String {
    let mut report = match Command::new(ROXE).arg("stat").output() {
        Ok(o) => format!("roxe stat:\n{}", String::from_utf8_lossy(&o.stdout)),
        Err(e) => format!("roxe stat: {e}\n"),
    };
    let parent_of = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command name in parentheses: state, then the ppid.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let mut tree = vec![root];
    let all: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    // Descendants in a few sweeps (a process tree is shallow here).
    for _ in 0..6 {
        for &pid in &all {
            if !tree.contains(&pid) && parent_of(pid).is_some_and(|p| tree.contains(&p)) {
                tree.push(pid);
            }
        }
    }
    if !on_path("gdb") {
        return report + "(no gdb: no stacks)\n";
    }
    for pid in tree {
        let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
            .unwrap_or_default()
            .replace('\0', " ");
        let Ok(o) = Command::new("timeout")
            .args(["20", "gdb", "-p", &pid.to_string(), "-batch"])
            .args(["-ex", "thread apply all bt 12"])
            .output()
        else {
            continue;
        };
        report += &format!("=== {pid} {cmd}\n");
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            if line.starts_with("Thread ") || line.starts_with('#') {
                report += &line.chars().take(180).collect::<String>();
                report.push('\n');
            }
        }
    }
    report
}

fn text(o: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn piped(mut c: Command) -> Child {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn roxe run")
}

/// A server, then (after `delay`) a client; both must exit 0. Their outputs.
fn pair(server: Command, client: Command, delay: Duration, what: &str) -> (Output, Output) {
    let s = piped(server);
    std::thread::sleep(delay);
    let c = finish(piped(client), what);
    let s = finish(s, what);
    assert!(
        s.status.success() && c.status.success(),
        "{what}:\n=== server\n{}\n=== client\n{}",
        text(&s),
        text(&c)
    );
    (s, c)
}

/// `../shared/tools/roce-check --strict -q` on `pcap` (skipped without it,
/// outside CI).
fn roce_check(pcap: &Path) {
    let Some(tool) = roxe_testnet::roce_check::tool() else {
        eprintln!("roce-check not found: {} not checked", pcap.display());
        return;
    };
    if let Err(report) = roxe_testnet::roce_check::strict(&tool, pcap) {
        panic!("roce-check --strict {}:\n{report}", pcap.display());
    }
    eprintln!("roce-check --strict {}: PASS", pcap.display());
}

/// A scratch directory of this process.
fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("roxe-middleware-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

/// A test's scratch directory: removed when the test passes (its captures
/// run to hundreds of MB), kept for a look when it fails.
struct Scratch(PathBuf);

impl Scratch {
    /// Keep the directory after the test (what it holds is used later).
    fn keep(self) -> PathBuf {
        let d = self.0.clone();
        std::mem::forget(self);
        d
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
fn roxe_run_shows_the_devices_where_the_kernel_does() {
    let addr = roxe_testnet::addr().to_string();
    let script = "cat /sys/class/infiniband/roxe0/ports/1/gids/1 \
        /sys/class/infiniband/roxe0/ports/1/gid_attrs/types/0 \
        /sys/class/infiniband/roxe0/ports/1/gid_attrs/ndevs/1 \
        /sys/class/infiniband/roxe0/ports/1/state \
        /sys/class/infiniband/roxe0/node_type; \
        ls /sys/class/infiniband/roxe0/device/net; \
        u=$(cat /sys/class/infiniband_verbs/uverbs$ROXE_UVERBS_BASE/ibdev); echo ibdev=$u; \
        test -c /dev/infiniband/uverbs$ROXE_UVERBS_BASE && echo uverbs-is-chr; \
        test -c /dev/infiniband/rdma_cm && echo rdma_cm-is-chr; \
        test -d /sys/class/net/lo && echo net-still-there; \
        test -c /dev/null && echo dev-null-still-there";
    let o = run_cmd(&addr, &[], "sh", &["-c", script]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    let octets: Vec<u8> = addr.split('.').map(|o| o.parse().unwrap()).collect();
    let gid = format!(
        "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
        octets[0], octets[1], octets[2], octets[3]
    );
    for want in [
        gid.as_str(),
        "RoCE v2",
        "lo",
        "4: ACTIVE",
        "1: CA",
        "ibdev=roxe0",
        "uverbs-is-chr",
        "rdma_cm-is-chr",
        "net-still-there",
        "dev-null-still-there",
    ] {
        assert!(out.contains(want), "no {want:?} in\n{}", text(&o));
    }
    // Nothing of it outside.
    assert!(!Path::new("/sys/class/infiniband/roxe0").exists());
    // rdma-core's own tool reads the view the same way.
    if installed("roxe_run_shows_devices", "ibverbs-utils", &["ibv_devinfo"]) {
        let o = run_cmd(&addr, &[], "ibv_devinfo", &["-v"])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success() && out.contains("roxe0"), "{}", text(&o));
        assert!(out.contains("GID[  1]:"), "index 1 listed: {out}");
    }
}

/// Where no namespace can be made, the preload (`--view preload`, what
/// `auto` falls back to): the same files through libroxe_view.so.
#[test]
fn roxe_run_preload_shows_the_same_files() {
    let addr = roxe_testnet::addr().to_string();
    let script = "cat /sys/class/infiniband/roxe0/ports/1/gid_attrs/types/1; \
        test -c /dev/infiniband/rdma_cm && echo rdma_cm-is-chr; \
        test -c /dev/infiniband/uverbs$ROXE_UVERBS_BASE && echo uverbs-is-chr; \
        ls /sys/class/infiniband/roxe0/device/net; \
        if test -e /sys/class/infiniband/roxe0/no-such; then echo wrong; fi";
    dropin_built();
    let o = Command::new(ROXE)
        .args(["run", "--view", "preload", "--", "sh", "-c", script])
        .env("ROXE_ADDR", &addr)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    for want in ["RoCE v2", "rdma_cm-is-chr", "uverbs-is-chr", "lo"] {
        assert!(out.contains(want), "no {want:?}: {}", text(&o));
    }
    assert!(!out.contains("wrong"), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("preloaded libroxe_view.so"),
        "{}",
        text(&o)
    );
    // Outside the program nothing changed.
    assert!(!Path::new("/sys/class/infiniband/roxe0").exists());
    if installed("preload", "ucx-utils", &["ucx_info"]) {
        let o = Command::new(ROXE)
            .args(["run", "-q", "--view", "preload", "--", "ucx_info", "-d"])
            .env("ROXE_ADDR", &addr)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("Transport: rc_verbs"), "{}", text(&o));
    }
}

/// The same without root, where the machine allows a user to: a user
/// namespace of its own.
#[test]
fn roxe_run_works_for_an_ordinary_user() {
    if !rustix_is_root() || !on_path("setpriv") {
        eprintln!("not root or no setpriv: this test runs as nobody from root");
        return;
    }
    dropin_built();
    let probe = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            ROXE,
            "--version",
        ])
        .output()
        .unwrap();
    if !probe.status.success() {
        eprintln!("nobody cannot run {ROXE} (a private directory on its path): skipped");
        return;
    }
    let addr = roxe_testnet::addr().to_string();
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", ROXE, "run", "--", "sh", "-c"])
        .arg("id -u; test -c /dev/infiniband/rdma_cm && echo chr; cat /sys/class/infiniband/roxe0/ports/1/gid_attrs/types/1")
        .env("ROXE_ADDR", &addr)
        .env("XDG_RUNTIME_DIR", "")
        .env("HOME", "/tmp")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    if err.contains("unshare(CLONE_NEWUSER") {
        eprintln!("unprivileged user namespaces are not allowed here: {err}");
        return;
    }
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        out.starts_with("65534\n") && out.contains("chr") && out.contains("RoCE v2"),
        "{}",
        text(&o)
    );
    assert!(
        err.contains("user and mount namespace (unprivileged)"),
        "{err}"
    );
}

fn rustix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// ucx_perftest between two processes: `server_env`/`client_env` (UCX_TLS),
/// then the client's args. The client's last line.
fn ucx_perftest(tls: &str, args: &[&str], pcap: Option<&Path>) -> String {
    let [sa, ca] = roxe_testnet::addrs().map(|a: Ipv4Addr| a.to_string());
    let port = roxe_testnet::port().to_string();
    let pcap_s = pcap.map(|p| p.display().to_string());
    let mut senv = vec![("UCX_TLS", tls)];
    if let Some(p) = &pcap_s {
        senv.push(("ROXE_PCAP", p.as_str()));
    }
    // A UCT test names the device on the server too; a UCP test does not.
    let mut s_args: Vec<&str> = vec!["-p", &port];
    if let Some(k) = args.iter().position(|a| *a == "-x") {
        s_args.extend(["-d", "roxe0:1", "-x", args[k + 1]]);
    }
    let mut c_args: Vec<&str> = vec!["127.0.0.1", "-p", &port]; // testnet: allow (ucx_perftest's control host)
    c_args.extend_from_slice(args);
    let (_, c) = pair(
        run_cmd(&sa, &senv, "ucx_perftest", &s_args),
        run_cmd(&ca, &[("UCX_TLS", tls)], "ucx_perftest", &c_args),
        Duration::from_millis(1500),
        &format!("ucx_perftest {tls} {args:?}"),
    );
    let out = String::from_utf8_lossy(&c.stdout).into_owned();
    let last = out
        .lines()
        .rfind(|l| l.starts_with("Final:"))
        .unwrap_or_else(|| panic!("no Final line:\n{}", text(&c)))
        .to_string();
    eprintln!("ucx_perftest UCX_TLS={tls} {args:?}: {last}");
    last
}

#[test]
fn ucx_lists_and_runs_rc_verbs_and_ud_verbs() {
    if !installed("ucx", "ucx-utils", &["ucx_info", "ucx_perftest"]) {
        return;
    }
    let addr = roxe_testnet::addr().to_string();
    let o = run_cmd(&addr, &[], "ucx_info", &["-d"]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    for tl in ["rc_verbs", "ud_verbs"] {
        let listed = out.lines().collect::<Vec<_>>().windows(2).any(|w| {
            w[0].contains(&format!("Transport: {tl}")) && w[1].contains("Device: roxe0:1")
        });
        assert!(listed, "{tl} on roxe0:1 not listed:\n{}", text(&o));
    }
    let dir = scratch("ucx");
    let cap = dir.join("uct-rc.pcap");
    ucx_perftest(
        "rc_verbs",
        &[
            "-d", "roxe0:1", "-x", "rc_verbs", "-t", "put_bw", "-D", "zcopy", "-s", "65536", "-n",
            "500",
        ],
        Some(&cap),
    );
    roce_check(&cap);
    for t in [
        &["-t", "am_lat", "-n", "1000"][..],
        &["-t", "am_bw", "-n", "1000"],
        &["-t", "get", "-D", "zcopy", "-s", "65536", "-n", "300"],
    ] {
        let mut a = vec!["-d", "roxe0:1", "-x", "rc_verbs"];
        a.extend_from_slice(t);
        ucx_perftest("rc_verbs", &a, None);
    }
    let cap = dir.join("uct-ud.pcap");
    ucx_perftest(
        "ud_verbs",
        &[
            "-d", "roxe0:1", "-x", "ud_verbs", "-t", "am_lat", "-n", "1000",
        ],
        Some(&cap),
    );
    roce_check(&cap);
    ucx_perftest(
        "ud_verbs",
        &[
            "-d", "roxe0:1", "-x", "ud_verbs", "-t", "am_bw", "-n", "1000",
        ],
        None,
    );
}

/// UCP between two processes over each verbs transport: `rc` (rc_verbs,
/// with ud_verbs for wire-up, as UCX's alias has it: rc_verbs alone cannot
/// wire up, on hardware too) and `ud` (ud_verbs).
#[test]
fn ucp_runs_over_rc_and_ud_verbs() {
    if !installed("ucp", "ucx-utils", &["ucx_perftest"]) {
        return;
    }
    let dir = scratch("ucp");
    for tls in ["rc,self", "ud,self"] {
        let cap = dir.join(format!("ucp-{}.pcap", &tls[..2]));
        ucx_perftest(tls, &["-t", "tag_lat", "-n", "1000", "-s", "8"], Some(&cap));
        roce_check(&cap);
        for t in ["tag_bw", "stream_bw", "ucp_put_bw"] {
            ucx_perftest(tls, &["-t", t, "-n", "1000", "-s", "65536"], None);
        }
        // Over UD, get is software RMA: the passive side answers on UCX's
        // async tick (about 1 ms, as over TCP), so fewer.
        ucx_perftest(tls, &["-t", "ucp_get", "-n", "100", "-s", "4096"], None);
    }
}

/// A C program of tests/c, compiled here with `cc` and `flags`, into a
/// directory of this call (two tests compiling one program at once must
/// not remove each other's executable).
fn compile(name: &str, compiler: &str, flags: &[&str]) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tests/c/{name}.c"));
    let dir = scratch(&format!("cc-{name}-{call}")).keep();
    let exe = dir.join(name);
    let o = Command::new(compiler)
        .args(["-O2", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(flags)
        .output()
        .expect("run the compiler");
    assert!(o.status.success(), "{compiler} {name}.c:\n{}", text(&o));
    exe
}

/// UCP endpoints made from an IP address and port (UCX's rdmacm connection
/// manager): a listener and a client exchange checked tagged messages and
/// a stream message.
#[test]
fn ucp_connects_by_ip_address_through_rdma_cm() {
    if !installed("ucp_sockaddr", "gcc", &["cc"]) {
        return;
    }
    if !Path::new("/usr/include/ucp/api/ucp.h").is_file() {
        assert!(!in_ci(), "libucx-dev missing under CI");
        eprintln!("ucp_sockaddr: SKIPPED: libucx-dev not installed");
        return;
    }
    let exe = compile("ucp_sockaddr", "cc", &["-lucp", "-lucs"]);
    let exe = exe.to_str().unwrap();
    for tls in ["rc,self", "ud,self"] {
        let [sa, ca] = roxe_testnet::addrs().map(|a: Ipv4Addr| a.to_string());
        let port = roxe_testnet::port().to_string();
        let (_, c) = pair(
            run_cmd(
                &sa,
                &[("UCX_TLS", tls)],
                exe,
                &["server", &sa, &port, "65536", "50"],
            ),
            run_cmd(
                &ca,
                &[("UCX_TLS", tls)],
                exe,
                &["client", &sa, &port, "65536", "50"],
            ),
            Duration::from_millis(1500),
            "ucp_sockaddr",
        );
        let out = String::from_utf8_lossy(&c.stdout);
        assert!(out.contains("ucp sockaddr ok"), "{}", text(&c));
        eprintln!("UCX_TLS={tls}: {}", out.trim());
    }
}

/// Open MPI over UCX on one host: a ping-pong whose bytes are checked and
/// an MPI_Allreduce over 4 ranks, every rank on roxe.
/// `roxe run -q -- mpirun -np NP ... EXE ARGS` over UCX's `rc` on roxe0.
fn mpirun(np: &str, exe: &Path, args: &[&str]) -> Command {
    dropin_built();
    let mut c = Command::new(ROXE);
    c.args(["run", "-q", "--", "mpirun", "-np", np])
        .args(if rustix_is_root() {
            &["--allow-run-as-root"][..]
        } else {
            &[]
        })
        .args([
            "--oversubscribe",
            "--mca",
            "pml",
            "ucx",
            "--mca",
            "btl",
            "^openib,uct",
        ])
        .arg(exe)
        .args(args)
        .env("UCX_TLS", "rc,self")
        .env("UCX_NET_DEVICES", "roxe0:1");
    c
}

#[test]
fn open_mpi_over_ucx() {
    if !installed("mpi", "openmpi-bin libopenmpi-dev", &["mpirun", "mpicc"]) {
        return;
    }
    let exe = compile("mpi_check", "mpicc", &[]);
    let dir = scratch("mpi");
    let cap = dir.join("mpi-%p.pcap");
    // Each rank takes the first free 127.0.0.N (ROXE_ADDR unset).
    for (np, args, pcap) in [
        ("2", &["1048576", "30"][..], Some(&cap)),
        ("4", &["65536", "10"], None),
    ] {
        let mut c = mpirun(np, &exe, args);
        c.env_remove("ROXE_ADDR");
        match pcap {
            Some(p) => c.env("ROXE_PCAP", p),
            None => c.env_remove("ROXE_PCAP"),
        };
        let o = finish(piped(c), "mpirun");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains("pingpong ok") && out.contains("allreduce ok"),
            "mpirun -np {np}:\n{}",
            text(&o)
        );
        eprintln!("mpirun -np {np}: {}", out.trim().replace('\n', "; "));
    }
    // One capture per rank (%p).
    let caps: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .collect();
    assert_eq!(caps.len(), 2, "{caps:?}");
    for c in &caps {
        roce_check(c);
    }
}

/// Open MPI over UCX with 4 ranks on one address, as ranks on one host
/// share its address: each rank its own slot of the QPN space.
#[test]
fn open_mpi_ranks_share_one_address() {
    if !installed("mpi", "openmpi-bin libopenmpi-dev", &["mpirun", "mpicc"]) {
        return;
    }
    let exe = compile("mpi_check", "mpicc", &[]);
    let addr = roxe_testnet::addr().to_string();
    let mut c = mpirun("4", &exe, &["65536", "10"]);
    c.env("ROXE_ADDR", &addr).env_remove("ROXE_PCAP");
    let o = finish(piped(c), "mpirun");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("pingpong ok") && out.contains("allreduce ok"),
        "mpirun -np 4 on {addr}:\n{}",
        text(&o)
    );
}

/// libfabric's verbs provider (MSG endpoints and RDM over ofi_rxm) between
/// two processes on two addresses of a veth pair, in a network namespace
/// of the test's own.
#[test]
fn libfabric_verbs_msg_and_rdm() {
    if !installed("libfabric", "libfabric-bin", &["fi_info", "fi_pingpong"])
        || !installed("libfabric", "iproute2", &["ip", "unshare"])
    {
        return;
    }
    dropin_built();
    let dir = scratch("fi");
    let cap = dir.join("fi-msg.pcap");
    let script = format!(
        "set -e; ip link set lo up; ip link add v0 type veth peer name v1; \
         ip addr add 10.99.0.1/24 dev v0; ip addr add 10.99.0.2/24 dev v1; \
         ip link set v0 up; ip link set v1 up; \
         R={roxe}; \
         ROXE_ADDR=10.99.0.1 $R run -q -- fi_info -p verbs > {d}/info.txt; \
         for ep in msg rdm; do \
           pcap=; [ $ep = msg ] && pcap={cap}; \
           ROXE_PCAP=$pcap ROXE_ADDR=10.99.0.1 timeout 60 $R run -q -- fi_pingpong -p verbs -e $ep -I 200 > {d}/s-$ep.txt 2>&1 & \
           sleep 1.5; \
           ROXE_ADDR=10.99.0.2 timeout 50 $R run -q -- fi_pingpong -p verbs -e $ep -I 200 10.99.0.1 > {d}/c-$ep.txt 2>&1; \
           wait $!; echo $ep-ok; \
         done",
        roxe = ROXE,
        d = dir.display(),
        cap = cap.display()
    );
    let root = rustix_is_root();
    let o = Command::new("unshare")
        .args(if root { &["-n"][..] } else { &["-rn"] })
        .args(["sh", "-c", &script])
        .env_remove("ROXE_ADDR")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success()
        && (err.contains("Operation not permitted") || err.contains("veth"))
        && !in_ci()
    {
        eprintln!("SKIPPED: no network namespace with a veth pair here:\n{err}");
        return;
    }
    // Lossy: a crash report may hold bytes that are not UTF-8.
    let read = |f: &str| {
        std::fs::read(dir.join(f))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|e| format!("({f}: {e})"))
    };
    let report = format!(
        "{}\ninfo:\n{}\nserver msg:\n{}\nclient msg:\n{}\nserver rdm:\n{}\nclient rdm:\n{}",
        text(&o),
        read("info.txt"),
        read("s-msg.txt"),
        read("c-msg.txt"),
        read("s-rdm.txt"),
        read("c-rdm.txt")
    );
    assert!(o.status.success(), "{report}");
    let info = read("info.txt");
    for want in ["FI_EP_MSG", "verbs;ofi_rxm", "domain: roxe0"] {
        assert!(info.contains(want), "no {want}: {report}");
    }
    assert!(
        !info.contains("roxe-"),
        "a device name with an address in it: {report}"
    );
    for ep in ["msg", "rdm"] {
        let c = read(&format!("c-{ep}.txt"));
        assert!(c.contains("1m") || c.contains("bytes"), "{ep}: {report}");
    }
    roce_check(&cap);
}

/// rdma-core's rdmacm tests (`tests/test_rdmacm.py`), which fork a
/// passive and an active process onto the first address of the device's
/// interface: roxe0 on 127.0.0.1, shared by both, in a network namespace
/// of the test's own (so that the address is the test's alone).
#[test]
fn rdma_core_rdmacm_tests_on_one_address() {
    const SUITE: &str = "/usr/share/doc/rdma-core/tests";
    if !installed("rdmacm tests", "iproute2", &["ip", "unshare"]) {
        return;
    }
    if !Path::new(SUITE).join("test_rdmacm.py").is_file() {
        assert!(
            !in_ci(),
            "python3-pyverbs is not installed (required under CI)"
        );
        eprintln!("SKIPPED: rdma-core's tests need python3-pyverbs");
        return;
    }
    dropin_built();
    let dir = scratch("rdmacm-tests");
    let suite = dir.join("tests");
    let _ = std::fs::remove_dir_all(&suite);
    let cp = Command::new("cp")
        .args(["-r", SUITE])
        .arg(&suite)
        .status()
        .unwrap();
    assert!(cp.success(), "copying {SUITE}");
    for e in std::fs::read_dir(&suite).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "gz") {
            let st = Command::new("gunzip").arg("-f").arg(e.path()).status();
            assert!(st.is_ok_and(|s| s.success()), "gunzip {:?}", e.path());
        }
    }
    // The first address of `lo`, in a network namespace of this test's own.
    let own_lo = "127.0.0.1"; // testnet: allow (the test's own network namespace)
    let script = format!(
        "set -e; ip link set lo up; cd {suite}; \
         ROXE_ADDR={own_lo} timeout 300 {roxe} run -q -- /usr/bin/python3 run_tests.py \
           --dev roxe0 --gid 0 -v test_rdmacm 2>&1",
        roxe = ROXE,
        suite = suite.display()
    );
    let root = rustix_is_root();
    let o = Command::new("unshare")
        .args(if root { &["-n"][..] } else { &["-rn"] })
        .args(["sh", "-c", &script])
        .env_remove("ROXE_ADDR")
        .output()
        .unwrap();
    let out = text(&o);
    if !o.status.success() && out.contains("Operation not permitted") && !in_ci() {
        eprintln!("SKIPPED: no network namespace here:\n{out}");
        return;
    }
    println!("{out}");
    assert!(o.status.success(), "{out}");
    assert!(out.contains("Ran 10 tests"), "{out}");
    // Only multicast is out of reach (roxe has no multicast groups).
    let skipped = out.matches("... skipped").count();
    let multicast = out.matches("skipped 'Multicast is not supported").count();
    assert_eq!(skipped, multicast, "{out}");
    assert_eq!(out.matches(" ... ok").count(), 7, "{out}");
}
