//! rdma-core's own verbs test suite (`tests/` of rdma-core, run through
//! pyverbs; Debian's `python3-pyverbs` installs it under
//! `/usr/share/doc/rdma-core/tests`, some files gzipped) over the drop-in,
//! as a user runs it: copied, gunzipped, then
//! `run_tests.py --dev roxe0 --gid 0 -v` with `LD_LIBRARY_PATH` on the
//! drop-in. Every test must pass or skip (no failure, no error), and at
//! least [`MIN_OK`] must pass. Skipped, with a message, where the suite is
//! not installed (under CI it must be: `scripts/test` installs it).

mod common;

use common::{lib_dir, scratch, Net};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const SUITE: &str = "/usr/share/doc/rdma-core/tests";
/// The suite's own interpreter: pyverbs is Debian's, for /usr/bin/python3.
const PYTHON: &str = "/usr/bin/python3";
/// Tests that pass (run minus skipped, from unittest's summary): 137 of
/// 273 since imports and tag matching (XRC, memory windows, on-demand
/// paging, device memory and extended CQs before them). A drop below this
/// is a regression.
const MIN_OK: usize = 137;

/// The skip reasons out of a software provider's reach (a substring of
/// unittest's "skipped '<reason>'"): vendor devices, raw packet QPs, a
/// kernel netdev, dmabuf, huge pages, GPUs, PCI devices. Any other skip is a
/// feature roxe lacks, and fails the test.
const OUT_OF_REACH: &[&str] = &[
    "non MLX5 device",
    "This is not an MLX5 device",
    "Converting timestamp to nanoseconds is not supported",
    "non EFA device",
    "Create QP type 8 is not supported",
    "Raw Packet QP",
    "doesn't have net interface",
    "Allocating dmabuf is not supported",
    "huge pages",
    "cuda-python",
    "PCI device must be passed",
];

fn installed() -> bool {
    let ok = Path::new(SUITE).join("run_tests.py").is_file()
        && Command::new(PYTHON)
            .args(["-c", "import pyverbs"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3-pyverbs is not installed (required under CI)"
        );
        eprintln!("SKIPPED: rdma-core's test suite needs python3-pyverbs (apt-get install python3-pyverbs)");
    }
    ok
}

#[test]
fn rdma_core_test_suite_passes_over_the_drop_in() {
    if !installed() {
        return;
    }
    let dir = scratch("pyverbs").join("tests");
    let cp = Command::new("cp")
        .args(["-r", SUITE])
        .arg(&dir)
        .status()
        .expect("cp");
    assert!(cp.success(), "copying {SUITE}");
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "gz") {
            let st = Command::new("gunzip").arg("-f").arg(e.path()).status();
            assert!(st.is_ok_and(|s| s.success()), "gunzip {:?}", e.path());
        }
    }
    let addr = Net::new().server(0);
    let start = Instant::now();
    let out = Command::new("timeout")
        .arg("600")
        .arg(PYTHON)
        .arg("run_tests.py")
        .args(["--dev", "roxe0", "--gid", "0", "-v"])
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("ROXE_ADDR", &addr)
        .output()
        .expect("run the suite");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    // "Ran N tests in ...s" and "OK (skipped=M)": passed = N - M (a
    // description can wrap the "... ok" of a test onto a later line).
    let number_after = |prefix: &str| -> Option<usize> {
        let at = text.find(prefix)? + prefix.len();
        let digits: String = text[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    let ok = number_after("\nRan ")
        .zip(Some(number_after("skipped=").unwrap_or(0)))
        .map_or(0, |(ran, skipped)| ran.saturating_sub(skipped));
    let bad: Vec<&&str> = lines
        .iter()
        .filter(|l| l.ends_with("... ERROR") || l.ends_with("... FAIL"))
        .collect();
    let ran = lines
        .iter()
        .find(|l| l.starts_with("Ran "))
        .copied()
        .unwrap_or("?");
    println!(
        "rdma-core tests over roxe ({addr}): {ran}; {ok} ok; {} failed or errored; {:.1?}",
        bad.len(),
        start.elapsed().min(Duration::from_secs(600))
    );
    assert!(
        bad.is_empty() && (out.status.success() || text.contains("\nOK")),
        "failures or errors:\n{}\n\n{text}",
        bad.iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        ok >= MIN_OK,
        "only {ok} tests passed (at least {MIN_OK} did before)\n{text}"
    );
    // Every skip is for something out of reach.
    let lacking: Vec<&str> = text
        .split("skipped ")
        .skip(1)
        .filter_map(|rest| {
            let quote = rest.chars().next().filter(|c| *c == '\'' || *c == '"')?;
            let reason = rest[1..].split(quote).next()?;
            (!OUT_OF_REACH.iter().any(|r| reason.contains(r))).then_some(reason)
        })
        .collect();
    assert!(
        lacking.is_empty(),
        "skipped for features roxe lacks: {lacking:#?}"
    );
}
