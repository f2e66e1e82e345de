//! Captures through `roce-check` (the independent oracle in
//! `../shared/tools`), strictly, with one exception it cannot judge.
//!
//! `--strict` fails on warnings, and one warning is a legal transport
//! behaviour: a go-back-N (NAK, timeout, tail-loss probe) that an ACK
//! overtakes ends where the ACK says, and the requester goes on with the
//! first PSN it never sent; roce-check expects the packet after a
//! retransmission to be the next PSN and reports a `psn-gap` (and, inside
//! a WRITE, a `write-length`). So a capture passes when roce-check passes
//! it strictly, or when its only warnings are those two kinds, it passes
//! without `--strict`, and [`roxe_wire::frontier`] finds that no
//! requester ever sent a PSN before all earlier ones.

use std::path::Path;
use std::process::Command;

/// Warnings an overtaken go-back causes in roce-check.
const OVERTAKEN_GO_BACK: [&str; 2] = ["psn-gap", "write-length"];

/// Run `python3 TOOL --strict -q CAPTURE`; `Ok(report)` when it passes,
/// or fails only on an overtaken go-back (then the report says so);
/// `Err(report)` otherwise.
pub fn strict(tool: &Path, capture: &Path) -> Result<String, String> {
    let run = |strict: bool| {
        let mut c = Command::new("python3");
        c.arg(tool);
        if strict {
            c.arg("--strict");
        }
        let out = c.arg("-q").arg(capture).output();
        match out {
            Ok(o) => (
                o.status.success(),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ),
            ),
            Err(e) => (false, format!("python3 {}: {e}", tool.display())),
        }
    };
    let (ok, report) = run(true);
    if ok {
        return Ok(report);
    }
    let kinds: Vec<&str> = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("warnings by kind: "))
        .map(|l| l.split(", ").filter_map(|k| k.split('=').next()).collect())
        .unwrap_or_default();
    if kinds.is_empty()
        || !kinds.contains(&"psn-gap")
        || kinds.iter().any(|k| !OVERTAKEN_GO_BACK.contains(k))
    {
        return Err(report);
    }
    let (lenient_ok, lenient) = run(false);
    if !lenient_ok {
        return Err(lenient);
    }
    let file = std::fs::File::open(capture)
        .map_err(|e| format!("{report}\nopen {}: {e}", capture.display()))?;
    match roxe_wire::frontier::skipped_psns(std::io::BufReader::new(file)) {
        Ok(skips) if skips.is_empty() => Ok(format!(
            "{report}\n(the {kinds:?} warnings are go-backs overtaken by ACKs: \
             no requester sent a PSN before every earlier one)"
        )),
        Ok(skips) => Err(format!(
            "{report}\nPSNs skipped:\n{}",
            skips
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        )),
        Err(e) => Err(format!("{report}\nreading {}: {e}", capture.display())),
    }
}
