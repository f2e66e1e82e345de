//! The socket held by a polling caller (`PacingConfig::caller_hold`, on by
//! default): a caller spinning on an empty CQ, or polling while a stream
//! comes in, keeps the socket from the progress thread (whose wake-ups
//! would only find it drained), for a while after its last poll (from
//! `MIN_CALLER_HOLD`, doubling per re-arm up to `CALLER_HOLD`), and fires
//! the engine's timers itself. These tests check when a
//! hold is taken (a burst of many messages, a spinning ping-pong), that a
//! program which stops polling still gets its packets received (the hold's
//! timer hands the socket back), that a holder's timers fire with the
//! progress thread stopped, and that arming a completion notification
//! ends a hold at once.

mod common;

use roxe_verbs::*;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
/// SENDs in the burst that makes the receiver a stream's.
const BURST: usize = 16;

struct Side {
    ctx: Context,
    qp: Qp,
    cq: Cq,
    mr: Mr,
    _pd: Pd,
}

fn side(name: &str, caller_hold: bool) -> Side {
    let base = DeviceConfig {
        pacing: PacingConfig {
            caller_hold,
            ..PacingConfig::default()
        },
        ..DeviceConfig::default()
    };
    let ctx = common::open_with(name, base);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let mr = pd
        .reg_mr(
            1 << 20,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    Side {
        ctx,
        qp,
        cq,
        mr,
        _pd: pd,
    }
}

fn pair(names: [&str; 2], caller_hold: bool) -> (Side, Side) {
    let a = side(names[0], caller_hold);
    let b = side(names[1], caller_hold);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    a.qp.connect(1, &b.qp.endpoint(2), Mtu::Mtu1024, access, 14)
        .unwrap();
    b.qp.connect(2, &a.qp.endpoint(1), Mtu::Mtu1024, access, 14)
        .unwrap();
    (a, b)
}

fn device(s: &Side) -> &soft::Device {
    s.ctx.soft_device().unwrap()
}

fn holds(s: &Side) -> u64 {
    s.ctx.stats().unwrap().driver.caller_holds
}

fn post_recvs(s: &Side, n: usize) {
    for i in 0..n {
        s.qp.post_recv(RecvWr {
            wr_id: i as u64,
            sg_list: vec![s.mr.sge(64 * i, 64)],
        })
        .unwrap();
    }
}

/// `a` sends `n` SENDs of 64 bytes as one post list.
fn send_list(a: &Side, n: usize, first_id: u64) {
    let wrs: Vec<SendWr> = (0..n as u64)
        .map(|i| SendWr::new(first_id + i, SendOpcode::Send, vec![a.mr.sge(0, 64)]))
        .collect();
    a.qp.post_send_list(wrs).map_err(|(_, e)| e).unwrap();
}

/// Receive completions at `s`, polling as a program spinning on its CQ.
fn poll_n(s: &Side, n: usize) {
    let wcs = s.cq.poll_wait(n, T).unwrap();
    for w in &wcs {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
    }
}

/// One `poll_cq` at `s` that finds nothing.
fn poll_empty(s: &Side) {
    let mut none = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 1];
    assert_eq!(s.cq.poll(&mut none).unwrap(), 0);
}

/// With `b`'s progress thread paused, a burst of SENDs waits in its socket
/// until its caller polls: that burst makes it a stream's receiver, and the
/// next empty poll takes a hold. Returns the holds taken by that poll.
fn take_hold(a: &Side, b: &Side) -> u64 {
    device(b).pause_progress_thread(true);
    post_recvs(b, BURST);
    send_list(a, BURST, 0);
    // The datagrams are in b's socket once the post returns (loopback
    // delivers within the sender's system call); b's caller receives them
    // in one burst.
    poll_n(b, BURST);
    let before = holds(b);
    let t0 = Instant::now();
    poll_empty(b);
    TOOK.with(|t| t.set(t0.elapsed()));
    holds(b) - before
}

thread_local! {
    /// How long `take_hold`'s empty poll took.
    static TOOK: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

/// Whether the hold `take_hold` took must still stand: its poll took less
/// than a hold. A caller preempted for a whole hold inside the poll, as a
/// loaded test machine may do, ends the hold at once
/// (`a_hold_taken_after_its_timer_fired_is_ended_by_the_caller`).
fn hold_must_stand() -> bool {
    let took = TOOK.with(|t| t.get());
    let stands = took < Duration::from_nanos(soft::MIN_CALLER_HOLD);
    if !stands {
        println!("the empty poll took {took:?}: the hold may have ended already");
    }
    stands
}

#[test]
fn a_burst_of_messages_makes_an_empty_poll_hold_the_socket() {
    let (a, b) = pair(["ch-a", "ch-b"], true);
    assert_eq!(take_hold(&a, &b), 1, "the empty poll after the burst holds");
    let on = device(&b).caller_hold_on();
    assert!(on || !hold_must_stand());
    // A program that stops polling now: the hold's timer gives the socket
    // back to the progress thread, which receives the next SEND and ACKs
    // it (a's completion needs that ACK).
    device(&b).pause_progress_thread(false);
    poll_n(&a, BURST);
    post_recvs(&b, 1);
    let t0 = Instant::now();
    send_list(&a, 1, 100);
    let wcs = a.cq.poll_wait(1, T).unwrap();
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(wcs[0].wr_id, 100);
    println!("completed {:?} after b stopped polling", t0.elapsed());
    assert!(
        !device(&b).caller_hold_on(),
        "the hold expired (b no longer polls)"
    );
}

/// A caller preempted between arming the hold's timer and taking the hold
/// for longer than the hold lasts: the timer fired (and the progress
/// thread saw it) before the hold was taken, so nothing but the caller can
/// end it. The caller ends it, and a program that stops polling still gets
/// its packets received. (Without that, `ib_write_lat`, which stops
/// polling its CQ to spin on memory, stalled until its peer's retries ran
/// out.)
#[test]
fn a_hold_taken_after_its_timer_fired_is_ended_by_the_caller() {
    let (a, b) = pair(["chl-late-a", "chl-late-b"], true);
    device(&b).pause_progress_thread(true);
    post_recvs(&b, BURST);
    send_list(&a, BURST, 0);
    poll_n(&b, BURST);
    // b now receives a stream: its next empty poll takes a hold, and waits
    // three holds' time between arming the timer and taking it, while the
    // progress thread runs and sees the timer fire.
    device(&b).pause_progress_thread(false);
    device(&b).delay_hold_taking(Duration::from_nanos(3 * soft::MIN_CALLER_HOLD));
    let before = holds(&b);
    poll_empty(&b);
    device(&b).delay_hold_taking(Duration::ZERO);
    assert_eq!(holds(&b) - before, 1, "the empty poll took a hold");
    assert!(
        !device(&b).caller_hold_on(),
        "a hold taken after its timer fired is ended at once"
    );
    // b stops polling: its progress thread receives the next SEND and
    // ACKs it.
    poll_n(&a, BURST);
    post_recvs(&b, 1);
    send_list(&a, 1, 100);
    let wcs = a.cq.poll_wait(1, T).unwrap();
    assert_eq!(wcs[0].status, WcStatus::Success, "{:?}", wcs[0]);
    assert_eq!(wcs[0].wr_id, 100);
}

#[test]
fn arming_a_notification_ends_the_hold() {
    let (a, b) = pair(["chn-a", "chn-b"], true);
    assert_eq!(take_hold(&a, &b), 1);
    assert!(device(&b).caller_hold_on() || !hold_must_stand());
    b.cq.req_notify(false).unwrap();
    assert!(
        !device(&b).caller_hold_on(),
        "a program about to sleep on its channel leaves the socket to the progress thread"
    );
    device(&b).pause_progress_thread(false);
}

#[test]
fn with_caller_hold_off_no_poll_holds() {
    let (a, b) = pair(["cho-a", "cho-b"], false);
    assert_eq!(take_hold(&a, &b), 0);
    assert!(!device(&b).caller_hold_on());
    device(&b).pause_progress_thread(false);
}

/// After a ping-pong of 64 KiB SENDs, a caller spinning on its empty CQ
/// holds the socket (the peer's datagrams would otherwise wake the
/// progress thread too), longer with each re-arm. A program that then
/// stops polling and waits on memory (`ib_write_lat` spins on its buffer)
/// still gets the peer's WRITE: the hold's timer hands the socket back to
/// the progress thread, and the next hold starts short again.
#[test]
fn a_spinning_ping_pong_holds_and_a_program_that_stops_polling_still_receives() {
    let (a, b) = pair(["chp-a", "chp-b"], true);
    const SIZE: u32 = 65536;
    for round in 0..50u64 {
        let (from, to) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        to.qp
            .post_recv(RecvWr {
                wr_id: round,
                sg_list: vec![to.mr.sge(0, SIZE)],
            })
            .unwrap();
        from.qp
            .post_send(SendWr::new(
                round,
                SendOpcode::Send,
                vec![from.mr.sge(0, SIZE)],
            ))
            .unwrap();
        poll_n(to, 1);
        poll_n(from, 1);
    }
    // b spins on its empty CQ until its hold has grown to its longest
    // (each re-arm doubles it).
    let t0 = Instant::now();
    while device(&b).caller_hold_len() < soft::CALLER_HOLD {
        assert!(t0.elapsed() < T, "b's hold never grew");
        poll_empty(&b);
    }
    assert!(holds(&b) > 0, "a spinning caller holds");
    assert_eq!(device(&b).caller_hold_len(), soft::CALLER_HOLD);
    // b stops polling. a's WRITE lands in b's memory without any verb of
    // b's, and a's completion needs b's ACK.
    let at = 4096;
    a.mr.write(0, &[0x5a; 64]).unwrap();
    let mut wr = SendWr::new(500, SendOpcode::RdmaWrite, vec![a.mr.sge(0, 64)]);
    wr.remote_addr = b.mr.addr() + at as u64;
    wr.rkey = b.mr.rkey();
    let t0 = Instant::now();
    a.qp.post_send(wr).unwrap();
    // (A test thread preempted for a whole hold since b's last poll finds
    // it ended already: then nothing waits for it.)
    let held = device(&b).caller_hold_on();
    let mut seen = [0u8; 64];
    while seen != [0x5a; 64] {
        assert!(t0.elapsed() < T, "the WRITE never landed at b");
        b.mr.read(at, &mut seen).unwrap();
        std::hint::spin_loop();
    }
    println!(
        "the WRITE landed {:?} after b stopped polling",
        t0.elapsed()
    );
    let wcs = a.cq.poll_wait(1, T).unwrap();
    assert_eq!((wcs[0].status, wcs[0].wr_id), (WcStatus::Success, 500));
    if !held {
        println!("b's hold had ended before the WRITE: nothing stranded");
        return;
    }
    // The WRITE waited for the hold to end: b's next holds start short.
    let stranded = || b.ctx.stats().unwrap().driver.holds_stranded;
    while stranded() == 0 {
        assert!(t0.elapsed() < T, "no hold counted as stranded");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(device(&b).caller_hold_len(), soft::MIN_CALLER_HOLD);
}

/// With its progress thread stopped, a caller spinning on its CQ (holding
/// the socket) fires the engine's timers itself: a SEND the peer neither
/// receives nor ACKs is probed, and completes once the peer answers.
#[test]
fn a_holding_caller_fires_the_timers() {
    let (a, b) = pair(["cht-a", "cht-b"], true);
    post_recvs(&b, 2);
    send_list(&a, 1, 1);
    poll_n(&b, 1);
    poll_n(&a, 1);
    device(&b).pause_progress_thread(true);
    device(&a).pause_progress_thread(true);
    send_list(&a, 1, 2);
    let probes = |s: &Side| s.ctx.stats().unwrap().engine.probes;
    let t0 = Instant::now();
    while probes(&a) == 0 {
        assert!(t0.elapsed() < T, "no probe fired");
        poll_empty(&a);
    }
    println!("probed after {:?}", t0.elapsed());
    assert!(a.ctx.stats().unwrap().driver.caller_timers > 0);
    device(&b).pause_progress_thread(false);
    poll_n(&b, 1);
    let wcs = a.cq.poll_wait(1, T).unwrap();
    assert_eq!((wcs[0].status, wcs[0].wr_id), (WcStatus::Success, 2));
    device(&a).pause_progress_thread(false);
}

/// `a` posts `n` SENDs of `size` bytes as one list to `b`, whose progress
/// thread is paused (no ACK comes back), then polls its CQ once, empty:
/// the holds that poll took.
fn hold_after_sending(a: &Side, b: &Side, n: usize, size: u32) -> u64 {
    device(b).pause_progress_thread(true);
    for i in 0..n as u64 {
        b.qp.post_recv(RecvWr {
            wr_id: i,
            sg_list: vec![b.mr.sge(0, size)],
        })
        .unwrap();
    }
    let wrs: Vec<SendWr> = (0..n as u64)
        .map(|i| SendWr::new(i, SendOpcode::Send, vec![a.mr.sge(0, size)]))
        .collect();
    a.qp.post_send_list(wrs).map_err(|(_, e)| e).unwrap();
    let before = holds(a);
    poll_empty(a);
    let taken = holds(a) - before;
    device(b).pause_progress_thread(false);
    poll_n(b, n);
    poll_n(a, n);
    taken
}

/// A sender with many small messages in flight from a post list holds
/// (its caller receives the ACKs); one with as many large ones does not
/// (their ACKs pace it, and the progress thread receives them alongside).
#[test]
fn a_post_list_of_small_messages_in_flight_makes_the_sender_hold() {
    let (a, b) = pair(["chs-a", "chs-b"], true);
    assert_eq!(hold_after_sending(&a, &b, 32, 64), 1, "64 B messages");
    let (c, d) = pair(["chl-a", "chl-b"], true);
    assert_eq!(hold_after_sending(&c, &d, 16, 65536), 0, "64 KiB messages");
}

/// A program that took a hold and then stopped polling (descheduled)
/// while its message's ACK waits in the socket: when the tail-loss probe's
/// timer comes, the progress thread receives the ACK first and sends no
/// probe. (A spurious probe of a READ that reached its responder after the
/// READ's memory window was gone failed the responder's QP: the drop-in's
/// `tutorial -w 1` test, under load in CI.)
#[test]
fn a_due_timer_receives_what_waits_before_it_probes() {
    let (a, b) = pair(["chdue-a", "chdue-b"], true);
    // A round trip measured first: the probe then waits its floor (1 ms).
    post_recvs(&a, 2);
    send_list(&b, 1, 1);
    poll_n(&b, 1);
    let probes = device(&b).stats().engine.probes;
    device(&b)
        .hold_socket_for(Duration::from_millis(50))
        .unwrap();
    send_list(&b, 1, 2);
    // a's progress thread receives the SEND and ACKs it; b's progress
    // thread, not watching the socket, wakes for the probe's timer.
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(
        device(&b).stats().engine.probes,
        probes,
        "a probe was sent for a message whose ACK waited in the socket"
    );
    assert!(device(&b).caller_hold_on(), "the hold still stands");
    let mut wc = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 1];
    assert_eq!(b.cq.poll(&mut wc).unwrap(), 1, "the ACK was received");
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::Success));
}
