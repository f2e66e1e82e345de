//! Helpers shared by the cross-crate integration tests in `tests/*.rs`.
//! (The criterion benchmarks in `benches/` belong to this package too.)

use std::path::{Path, PathBuf};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The shared directory beside the clone (`../shared`), when present.
pub fn shared_dir() -> Option<PathBuf> {
    let p = workspace_root().join("../shared");
    p.is_dir().then_some(p)
}

/// True when running under CI, where optional inputs must be present.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| v == "true" || v == "1")
}

/// Captures to check: the project's copies, plus every capture in
/// `../shared/golden/{public,rxe}` when that exists.
pub fn golden_captures() -> Vec<PathBuf> {
    let mut out = pcaps_in(&workspace_root().join("tests/data/golden"));
    if let Some(shared) = shared_dir() {
        for set in ["public", "rxe"] {
            out.extend(pcaps_in(&shared.join("golden").join(set)));
        }
    } else {
        eprintln!("../shared/golden not found: checking the project's copies only");
    }
    out
}

fn pcaps_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The (file-name suffix, frame number) of every packet in the golden sets
/// whose ICRC is wrong on purpose.
pub const DELIBERATELY_BAD_ICRC: &[(&str, u64)] = &[("host_probe_mad_ping.pcap", 3)];

/// True for the packets listed in [`DELIBERATELY_BAD_ICRC`].
pub fn is_deliberately_bad(path: &Path, frame: u64) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    DELIBERATELY_BAD_ICRC
        .iter()
        .any(|(suffix, f)| name.ends_with(suffix) && *f == frame)
}

/// The independent checker `../shared/tools/roce-check` and a python3 to run
/// it, when both exist. Under CI their absence is a test failure.
pub fn roce_check() -> Option<PathBuf> {
    let tool = shared_dir().map(|s| s.join("tools/roce-check"));
    let python = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    match tool {
        Some(t) if t.is_file() && python => Some(t),
        _ => {
            assert!(
                !in_ci(),
                "CI must run the roce-check oracle: ../shared/tools/roce-check or python3 missing"
            );
            eprintln!("SKIP: roce-check oracle not available (needs ../shared/tools and python3)");
            None
        }
    }
}
