//! The libibverbs contract of the drop-in `libibverbs.so.1`, checked from
//! C: `tests/c/verbs_contract.c` (completion channels, EBUSY on destroy,
//! errnos and return conventions, GID queries, `ibv_wr_*`, immediate
//! data, QP state) is compiled with the system `<infiniband/verbs.h>` and
//! run in one process over the library (`common::lib_dir`).
//!
//! The library is built first (`cargo build -p roxe-ibverbs`, same profile
//! and target directory as this test): `cargo test` does not build a
//! cdylib for integration tests. Skipped, with a message, when `cc` or
//! `/usr/include/infiniband/verbs.h` is missing.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the C program may run before it is killed.
const DEADLINE: Duration = Duration::from_secs(30);

const HEADER: &str = "/usr/include/infiniband/verbs.h";

fn have_cc() -> bool {
    Command::new("cc")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Read a pipe to its end on a thread (so a full pipe never blocks the
/// child while we wait for it).
fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    })
}

/// Wait for `child` until the deadline, killing it then; `None` on timeout.
fn wait_bounded(child: &mut Child) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait().expect("wait for the C program") {
            Some(s) => return Some(s),
            None if start.elapsed() > DEADLINE => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[test]
fn verbs_contract_c() {
    if !have_cc() {
        eprintln!("SKIPPED verbs_contract_c: no C compiler (`cc`)");
        return;
    }
    if !Path::new(HEADER).is_file() {
        eprintln!("SKIPPED verbs_contract_c: {HEADER} missing (install libibverbs-dev)");
        return;
    }
    let lib_dir = common::lib_dir();

    let tmp = std::env::temp_dir().join(format!("roxe-verbs-contract-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("create the temp directory");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/c/verbs_contract.c");
    let exe = tmp.join("verbs_contract");
    let out = Command::new("cc")
        .args(["-Wall", "-Werror", "-O2", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc {} failed: {}\n{}{}",
        src.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let mut child = Command::new(&exe)
        .env("LD_LIBRARY_PATH", lib_dir)
        .env("ROXE_ADDR", roxe_testnet::addr().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", exe.display()));
    let stdout = drain(child.stdout.take().expect("stdout"));
    let stderr = drain(child.stderr.take().expect("stderr"));
    let status = wait_bounded(&mut child);
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    println!("{stdout}");
    if !stderr.is_empty() {
        println!("stderr:\n{stderr}");
    }
    let _ = std::fs::remove_dir_all(&tmp);

    let Some(status) = status else {
        panic!("verbs_contract killed after {DEADLINE:?}\n{stdout}\nstderr:\n{stderr}");
    };
    let failed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        status.success() && failed.is_empty(),
        "verbs_contract exited {status}; failed checks:\n{}\n\nfull output:\n{stdout}\nstderr:\n{stderr}",
        failed.join("\n")
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("ok ")),
        "no checks ran:\n{stdout}"
    );
}
