//! Timer slack: how much later than asked the kernel may end a thread's
//! timed sleep, to batch wake-ups. Linux gives every thread 50 µs. On the
//! machine measured, a 20 µs `nanosleep` lasted 82 µs with it and 29 µs
//! with [`SLACK`] (docs/PERFORMANCE.md, session 27).
//!
//! A program's thread sleeps in the driver only to coalesce a bulk
//! stream's bursts, and the end of a 1 MiB READ waited out the stretched
//! sleep; so that sleep takes [`SLACK`], and the thread then gets its own
//! back. The progress thread keeps the default: its coalescing was tuned
//! with it, and with [`SLACK`] it woke 1.7 times as often in a WRITE
//! stream.

use std::num::NonZeroU64;
use std::time::Duration;

/// The slack of a program thread's sleep in the driver: 1 µs.
pub const SLACK: NonZeroU64 = NonZeroU64::new(1_000).unwrap();

/// Sleep `d` in a program's thread with [`SLACK`], then restore the
/// thread's own slack.
pub(super) fn sleep_in_program_thread(d: Duration) {
    with_slack(|| std::thread::sleep(d));
}

/// Run `f` with [`SLACK`] (or the thread's own, if finer), then restore
/// the thread's own. A failure to change it leaves it as it was: sleeps
/// are longer, nothing else changes.
fn with_slack<T>(f: impl FnOnce() -> T) -> T {
    let own = rustix::thread::current_timer_slack().ok();
    if own.is_some_and(|s| s > SLACK.get()) {
        let _ = rustix::thread::set_current_timer_slack(Some(SLACK));
        let r = f();
        let _ = rustix::thread::set_current_timer_slack(own.and_then(NonZeroU64::new));
        r
    } else {
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slack() -> u64 {
        rustix::thread::current_timer_slack().unwrap()
    }

    #[test]
    fn a_sleep_in_a_program_thread_has_a_microsecond_of_slack_then_the_threads_own() {
        std::thread::spawn(|| {
            rustix::thread::set_current_timer_slack(NonZeroU64::new(77_000)).unwrap();
            assert_eq!(with_slack(slack), 1_000);
            assert_eq!(slack(), 77_000);
            sleep_in_program_thread(Duration::from_micros(5));
            assert_eq!(slack(), 77_000);
            // A thread whose slack is already finer keeps it.
            rustix::thread::set_current_timer_slack(NonZeroU64::new(10)).unwrap();
            assert_eq!(with_slack(slack), 10);
            assert_eq!(slack(), 10);
        })
        .join()
        .unwrap();
    }
}
