//! `ROXE_LOG`: the provider's `tracing` events (QP state changes,
//! retransmission timeouts, go-back-N, RNR and sequence NAKs, retry
//! exhaustion, CQ overflow, CM messages, the liveness watchdog) on stderr,
//! filtered by an `EnvFilter` string: `ROXE_LOG=debug`,
//! `ROXE_LOG=roxe_provider::engine=trace`. Unset: nothing is installed and
//! every event costs one cached "disabled" check.

use std::sync::Once;

/// Install the stderr subscriber if `ROXE_LOG` is set (once per process;
/// a subscriber the program installed itself wins).
pub fn init_from_env() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Some(spec) = std::env::var("ROXE_LOG").ok().filter(|v| !v.is_empty()) else {
            return;
        };
        let filter = match tracing_subscriber::EnvFilter::try_new(&spec) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("roxe: ROXE_LOG={spec:?} is not a valid filter ({e}); logging off");
                return;
            }
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(true)
            .try_init();
    });
}
