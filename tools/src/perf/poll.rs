//! Waiting for completions in `roxe perf`.
//!
//! A CQ poller spins bare, as perftest's do; with `-e` it sleeps on a
//! completion channel instead. A soft device's `Cq::poll` receives in the
//! caller's thread and yields the core every 64 empty polls itself; a
//! backoff on top left a ping-pong's answer to the progress thread. Every
//! wait ends at `--timeout`, and the CQ loops also watch the control
//! connection, so a peer's failure stops both sides at once.

use super::ctrl::Ctrl;
use super::setup::Setup;
use super::{ctx, Res};
use roxe_verbs::{CompChannel, Cq, WcOpcode, WcStatus, WorkCompletion};
use std::time::{Duration, Instant};

fn wc_error(wc: &WorkCompletion) -> String {
    format!(
        "work completion error: status {:?} ({}), opcode {:?}, QP {:#x}, wr_id {:#x}",
        wc.status, wc.status as u32, wc.opcode, wc.qp_num, wc.wr_id
    )
}

/// Polls a CQ: spins (or sleeps on the channel), and every few milliseconds
/// checks the deadline and the control connection.
pub struct Poller<'a> {
    cq: &'a Cq,
    channel: Option<&'a CompChannel>,
    ctrl: &'a Ctrl,
    deadline: Instant,
    what: &'static str,
    idle: u32,
    next_check: Instant,
}

impl<'a> Poller<'a> {
    pub fn new(s: &'a Setup, ctrl: &'a Ctrl, deadline: Instant, what: &'static str) -> Self {
        Poller {
            cq: &s.cq,
            channel: s.channel.as_ref(),
            ctrl,
            deadline,
            what,
            idle: 0,
            next_check: Instant::now(),
        }
    }
    /// Some completions (never zero), all successful.
    pub fn poll<'b>(&mut self, buf: &'b mut [WorkCompletion]) -> Res<&'b [WorkCompletion]> {
        loop {
            let mut n = self.cq.poll(buf).map_err(|e| e.to_string())?;
            if n == 0 {
                if let Some(ch) = self.channel {
                    // Arm, look once more (a completion may have slipped
                    // in before arming), then sleep until the event.
                    self.cq.req_notify(false).map_err(|e| e.to_string())?;
                    n = self.cq.poll(buf).map_err(|e| e.to_string())?;
                    if n == 0 {
                        let left = self.deadline.saturating_duration_since(Instant::now());
                        ch.get_event_timeout(left.min(Duration::from_millis(5)))
                            .map_err(ctx("completion channel"))?;
                    }
                }
            }
            if n > 0 {
                self.idle = 0;
                if let Some(bad) = buf[..n].iter().find(|w| w.status != WcStatus::Success) {
                    return Err(wc_error(bad));
                }
                return Ok(&buf[..n]);
            }
            self.idle = self.idle.saturating_add(1);
            let sleeping = self.channel.is_some();
            // Reading the clock is not free everywhere (a syscall where the
            // clocksource is HPET, as in emulated guests): while spinning,
            // look at it every 1024 empty polls only.
            if sleeping || self.idle & 1023 == 0 {
                let now = Instant::now();
                if now >= self.next_check {
                    self.next_check = now + Duration::from_millis(5);
                    if now >= self.deadline {
                        return Err(format!("timed out waiting for {}", self.what));
                    }
                    self.ctrl.check()?;
                }
            }
        }
    }
}

/// Room for one poll's completions.
pub fn blank_wcs() -> [WorkCompletion; 64] {
    [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 64]
}
