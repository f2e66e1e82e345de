//! `ROXE_LOG` (or rdma-core's `VERBS_LOG_LEVEL` with `VERBS_LOG_FILE`):
//! the provider's `tracing` events (QP state changes,
//! retransmission timeouts, go-back-N, RNR and sequence NAKs, retry
//! exhaustion, CQ overflow, CM messages, the liveness watchdog) on stderr,
//! filtered by an `EnvFilter` string: `ROXE_LOG=debug`,
//! `ROXE_LOG=roxe_provider::engine=trace`. Unset: nothing is installed and
//! every event costs one cached "disabled" check.

use std::sync::Once;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// rdma-core's `VERBS_LOG_LEVEL` (0 none, 1 error, 2 warn, 3 info, 4
/// debug) as a filter; None for 0 or a value that is not a number.
pub fn verbs_log_filter(level: &str) -> Option<&'static str> {
    let level = level.trim();
    let n = if let Some(hex) = level.strip_prefix("0x") {
        i64::from_str_radix(hex, 16).ok()?
    } else {
        level.parse::<i64>().ok()?
    };
    match n {
        i64::MIN..=0 => None,
        1 => Some("error"),
        2 => Some("warn"),
        3 => Some("info"),
        _ => Some("debug"),
    }
}

/// Where the events go and with which filter: `ROXE_LOG` (stderr), else
/// rdma-core's `VERBS_LOG_LEVEL` written to `VERBS_LOG_FILE` (appended;
/// without a file nothing, as a release build of libibverbs does).
fn spec_from_env() -> Option<(String, Option<String>)> {
    if let Some(spec) = std::env::var("ROXE_LOG").ok().filter(|v| !v.is_empty()) {
        return Some((spec, None));
    }
    let level = std::env::var("VERBS_LOG_LEVEL").ok()?;
    let filter = verbs_log_filter(&level)?;
    let file = std::env::var("VERBS_LOG_FILE")
        .ok()
        .filter(|f| !f.is_empty())?;
    Some((filter.to_string(), Some(file)))
}

/// Install the subscriber `ROXE_LOG` or `VERBS_LOG_LEVEL`/`VERBS_LOG_FILE`
/// ask for (once per process; a subscriber the program installed itself
/// wins).
pub fn init_from_env() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Some((spec, file)) = spec_from_env() else {
            return;
        };
        let filter = match tracing_subscriber::EnvFilter::try_new(&spec) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("roxe: ROXE_LOG={spec:?} is not a valid filter ({e}); logging off");
                return;
            }
        };
        // No colours (the `ansi` feature is not built; asking for it panics).
        let writer = match file {
            None => BoxMakeWriter::new(std::io::stderr),
            Some(path) => match std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
            {
                Ok(f) => BoxMakeWriter::new(std::sync::Mutex::new(f)),
                // As libibverbs: a log file that cannot be opened means no log.
                Err(_) => return,
            },
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(writer)
            .with_ansi(false)
            .with_target(true)
            .try_init();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_log_levels_map_to_filters() {
        assert_eq!(verbs_log_filter("0"), None);
        assert_eq!(verbs_log_filter("1"), Some("error"));
        assert_eq!(verbs_log_filter("2"), Some("warn"));
        assert_eq!(verbs_log_filter("3"), Some("info"));
        assert_eq!(verbs_log_filter("4"), Some("debug"));
        assert_eq!(verbs_log_filter("0x4"), Some("debug"));
        assert_eq!(verbs_log_filter("lots"), None);
    }
}
