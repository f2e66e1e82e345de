//! A CQ poll during a stream of single posts is ACK-clocked as the posts
//! are: the messages they hold (posted while 16 or more PSNs wait for
//! their ACK) leave with the ACK's pass, not one small batch per poll
//! (perftest's `ib_write_bw` polls a completion per message). A ping-pong's
//! poll, with fewer than 8 messages posted, still sends at once.
//!
//! Each test: `a`'s first WRITE completes and its completion is left in
//! the CQ (seen through the channel, not polled); both progress threads
//! are paused, so no ACK comes back; `a` posts `n` single 64 KiB WRITEs (the
//! first leaves at once, 16 packets; the rest wait for its ACK); then `a`
//! polls, which takes the engine (a completion waits) and runs a pass.

mod common;

use common::{connect_sides, Side, SideShape};
use roxe_verbs::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);
const SIZE: usize = 65536;
/// Packets of one message at MTU 4096.
const PACKETS: u64 = (SIZE / 4096) as u64;

const ACCESS: AccessFlags = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0);

fn side(name: &str, base: DeviceConfig) -> Side {
    let shape = SideShape {
        cq_depth: 64,
        max_wr: 32,
        mr_len: SIZE,
        access: ACCESS,
    };
    common::side(name, base, &shape)
}

fn write(a: &Side, b: &Side, wr_id: u64) -> SendWr {
    let mut wr = SendWr::new(wr_id, SendOpcode::RdmaWrite, vec![a.mr.sge(0, SIZE as u32)]);
    wr.remote_addr = b.mr.addr();
    wr.rkey = b.mr.rkey();
    wr
}

/// Packets `s` sent for the first time: datagrams less retransmissions
/// (a tail-loss probe on a loaded machine resends one).
fn sent(s: &Side) -> u64 {
    let st = s.ctx.stats().unwrap();
    st.driver.tx_datagrams - st.engine.tx_retransmits
}

/// Runs the sequence of the module documentation with `n` WRITEs and
/// returns the packets `a`'s poll sent.
fn packets_sent_by_the_poll(names: [&str; 2], n: u64) -> u64 {
    let base = DeviceConfig::default;
    let (a, b) = (side(names[0], base()), side(names[1], base()));
    // A 4 s ACK timeout: no retransmission while b is paused.
    connect_sides(&a, &b, ACCESS, 20);
    a.cq.req_notify(false).unwrap();
    a.qp.post_send(write(&a, &b, 0)).unwrap();
    assert_eq!(
        a.channel.get_event_timeout(T).unwrap(),
        Some(a.cq.id()),
        "the first WRITE completes"
    );
    // b's thread: no ACK; a's: no pass of its own (a post that arms an
    // earlier timer wakes it).
    let devices = [a.ctx.soft_device().unwrap(), b.ctx.soft_device().unwrap()];
    for d in &devices {
        d.pause_progress_thread(true);
    }
    let before = sent(&a);
    for i in 1..=n {
        a.qp.post_send(write(&a, &b, i)).unwrap();
    }
    assert_eq!(
        sent(&a) - before,
        PACKETS,
        "the first of the {n} left at once, the rest wait for its ACK"
    );
    let before = sent(&a);
    let wcs = a.cq.poll_wait(1, T).unwrap();
    assert_eq!((wcs[0].wr_id, wcs[0].status), (0, WcStatus::Success));
    let by_poll = sent(&a) - before;
    for d in &devices {
        d.pause_progress_thread(false);
    }
    let wcs = a.cq.poll_wait(n as usize, T).unwrap();
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    by_poll
}

#[test]
fn a_poll_in_a_stream_of_single_posts_leaves_held_messages_for_the_ack() {
    let by_poll = packets_sent_by_the_poll(["acp-a", "acp-b"], 10);
    assert_eq!(by_poll, 0, "10 messages posted: the poll sent none");
}

#[test]
fn a_poll_in_a_ping_pong_sends_the_held_message_at_once() {
    let by_poll = packets_sent_by_the_poll(["acq-a", "acq-b"], 2);
    assert_eq!(
        by_poll, PACKETS,
        "2 messages posted: the poll sent the second"
    );
}

/// `a` streams `n` single-posted, signaled 64 KiB WRITEs to `b` as
/// perftest's `ib_write_bw` does (16 outstanding, one posted per
/// completion), its thread spinning on the CQ, then stops polling for
/// 200 ms. Returns `a`'s `tx_left_to_caller`, the packets it sent by
/// the end of those 200 ms, and the WRITEs posted by then.
fn stream_then_pause(
    names: [&str; 2],
    mut base: DeviceConfig,
    handover_window: Option<Duration>,
    n: u64,
    stop_after: u64,
) -> (u64, u64, u64) {
    if let Some(d) = handover_window {
        base.pacing.handover_window = d;
    }
    let (a, b) = (side(names[0], base.clone()), side(names[1], base));
    connect_sides(&a, &b, ACCESS, 14);
    let mut posted = 0;
    while posted < 16 {
        a.qp.post_send(write(&a, &b, posted)).unwrap();
        posted += 1;
    }
    let mut done = 0;
    let mut out = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 16];
    let t0 = std::time::Instant::now();
    while done < stop_after {
        assert!(t0.elapsed() < T, "{done} of {n} completed in {T:?}");
        let got = a.cq.poll(&mut out).unwrap();
        for wc in &out[..got] {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            done += 1;
            if posted < n {
                a.qp.post_send(write(&a, &b, posted)).unwrap();
                posted += 1;
            }
        }
    }
    // No poll now: what was left to this caller must leave all the same.
    std::thread::sleep(Duration::from_millis(200));
    let stats = a.ctx.stats().unwrap().driver;
    let first_sends = sent(&a);
    let wcs = a.cq.poll_wait((posted - done) as usize, T).unwrap();
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    (stats.tx_left_to_caller, first_sends, posted)
}

/// perftest's pattern: the progress thread, handling an ACK while the
/// caller spins on the CQ, leaves the messages held for that ACK to the
/// caller's next poll. (The window for "polled recently" is stretched to
/// 10 s here so that a loaded machine's scheduling cannot decide it.)
#[test]
fn the_progress_thread_leaves_held_messages_to_a_polling_caller() {
    let (left, _, _) = stream_then_pause(
        ["hnd-a", "hnd-b"],
        DeviceConfig::default(),
        Some(Duration::from_secs(10)),
        400,
        400,
    );
    assert!(left > 0, "no pass left its held messages to the caller");
}

/// With ACK clocking off nothing is held, so nothing is left.
#[test]
fn without_ack_clocking_nothing_is_left_to_the_caller() {
    let base = DeviceConfig {
        pacing: PacingConfig {
            ack_clocked: false,
            ..PacingConfig::default()
        },
        ..DeviceConfig::default()
    };
    let (left, _, _) = stream_then_pause(
        ["hne-a", "hne-b"],
        base,
        Some(Duration::from_secs(10)),
        400,
        400,
    );
    assert_eq!(left, 0);
}

/// A caller that stops polling mid-stream (after 200 completions, with 16
/// WRITEs outstanding) strands nothing: every message posted leaves within
/// the 200 ms pause (what the progress thread left to it goes with the
/// next ACK's pass, or the thread's own at most 50 µs later).
#[test]
fn messages_left_to_a_caller_that_stops_polling_still_leave() {
    let (_, sent, posted) =
        stream_then_pause(["hnf-a", "hnf-b"], DeviceConfig::default(), None, 400, 200);
    assert_eq!(
        sent,
        posted * PACKETS,
        "every WRITE posted sent before any poll"
    );
}
