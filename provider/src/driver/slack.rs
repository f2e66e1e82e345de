//! Timer slack: how much later than asked the kernel may end a thread's
//! timed sleep, to batch wake-ups. Linux gives every thread 50 µs. The
//! driver's timed sleeps are short and on the data path (a 20 µs
//! coalescing interval, a 100 µs ACK hold, a 50 µs hand-over), and on the
//! machine measured a 20 µs `nanosleep` lasted 82 µs with the default
//! slack and 29 µs with [`SLACK`] (docs/PERFORMANCE.md, session 27). So
//! the progress thread runs with [`SLACK`], and a program's thread has it
//! only for the driver's own sleep in it, then gets its own back.

use std::num::NonZeroU64;
use std::time::Duration;

/// The slack of the driver's sleeps, in nanoseconds: 1 µs.
pub const SLACK: NonZeroU64 = NonZeroU64::new(1_000).unwrap();

/// Give the calling thread (the progress thread, at its start) [`SLACK`];
/// returns the slack it then has (0 if unknown). A failure leaves the
/// default: sleeps are longer, nothing else changes.
pub(super) fn for_this_thread() -> u64 {
    let _ = rustix::thread::set_current_timer_slack(Some(SLACK));
    rustix::thread::current_timer_slack().unwrap_or(0)
}

/// Sleep `d` in a program's thread with [`SLACK`], then restore the
/// thread's own slack.
pub(super) fn sleep_in_program_thread(d: Duration) {
    let own = rustix::thread::current_timer_slack().ok();
    if own.is_some_and(|s| s > SLACK.get()) {
        let _ = rustix::thread::set_current_timer_slack(Some(SLACK));
        std::thread::sleep(d);
        let _ = rustix::thread::set_current_timer_slack(own.and_then(NonZeroU64::new));
    } else {
        std::thread::sleep(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleep_in_a_program_thread_leaves_the_thread_its_own_slack() {
        std::thread::spawn(|| {
            let own = NonZeroU64::new(77_000);
            rustix::thread::set_current_timer_slack(own).unwrap();
            sleep_in_program_thread(Duration::from_micros(5));
            assert_eq!(rustix::thread::current_timer_slack().unwrap(), 77_000);
            // A thread whose slack is already finer keeps it.
            rustix::thread::set_current_timer_slack(NonZeroU64::new(10)).unwrap();
            sleep_in_program_thread(Duration::from_micros(5));
            assert_eq!(rustix::thread::current_timer_slack().unwrap(), 10);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_driver_slack_is_one_microsecond() {
        assert_eq!(SLACK.get(), 1_000);
        std::thread::spawn(|| {
            assert_eq!(for_this_thread(), 1_000);
            assert_eq!(rustix::thread::current_timer_slack().unwrap(), 1_000);
        })
        .join()
        .unwrap();
    }
}
