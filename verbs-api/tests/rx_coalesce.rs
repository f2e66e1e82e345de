//! Receive coalescing (`PacingConfig::rx_coalesce`, 20 µs by default):
//! after a receive burst of 32 KiB or more, the progress thread sleeps
//! without watching the socket, so a bulk stream arrives in larger bursts
//! and the sender's datagrams do not each wake it. These tests check that
//! a burst of two whole 64 KiB WRITEs makes the receiver coalesce, that a
//! stream of them does and lands every byte, that a burst as large of
//! small SENDs does not (their senders
//! wait on prompt ACKs), nor one whole large message (a ping-pong's), that
//! it never does with coalescing off, and that a program arming a
//! completion notification ends a coalescing sleep at once. A caller
//! polling a CQ coalesces too, after two bulk bursts in a row (a READ
//! stream's requester), never after one message at a time, nor when the
//! bursts brought all its READs were owed.

mod common;

use common::{connect_sides, Side, SideShape};
use roxe_verbs::*;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
const SIZE: usize = 65536;
const WRITES: usize = 64;

fn pair(names: [&str; 2], rx_coalesce_us: u32) -> (Side, Side) {
    let base = DeviceConfig {
        pacing: PacingConfig {
            rx_coalesce: Duration::from_micros(rx_coalesce_us.into()),
            ..PacingConfig::default()
        },
        ..DeviceConfig::default()
    };
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let shape = SideShape {
        cq_depth: 2048,
        max_wr: 1024,
        mr_len: WRITES * SIZE,
        access,
    };
    let a = common::side(names[0], base.clone(), &shape);
    let b = common::side(names[1], base, &shape);
    connect_sides(&a, &b, access, 14);
    (a, b)
}

fn coalesced(s: &Side) -> u64 {
    s.ctx.stats().unwrap().driver.rx_coalesced
}

/// `a` WRITEs `WRITES` messages of 64 KiB, each a different pattern, into
/// `b`'s region as one post list, and polls until all complete. `b` never
/// polls: its progress thread receives everything. Then every byte at `b`
/// is checked.
fn write_stream(a: &Side, b: &Side) {
    let mut data = vec![0u8; WRITES * SIZE];
    for (i, x) in data.iter_mut().enumerate() {
        *x = (i / SIZE) as u8 ^ (i as u8).wrapping_mul(31);
    }
    a.mr.write(0, &data).unwrap();
    write_whole(a, b, WRITES);
    let wcs = a.cq.poll_wait(WRITES, T).unwrap();
    for w in &wcs {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
    }
    let mut got = vec![0u8; WRITES * SIZE];
    b.mr.read(0, &mut got).unwrap();
    assert!(got == data, "the WRITEs landed intact");
}

/// With b's progress thread paused, two 64 KiB WRITEs wait whole in its
/// socket; let go, the thread receives them as one burst of 128 KiB that
/// ends two messages, and sleeps once before it looks again.
#[test]
fn a_bulk_burst_makes_the_receiver_coalesce() {
    let (a, b) = pair(["rcb-a", "rcb-b"], 20);
    write_burst(&a, &b, 2);
    // Counted when the sleep ends: wait for it.
    let t0 = Instant::now();
    while coalesced(&b) == 0 && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(coalesced(&b), 1, "two whole WRITEs in one burst");
    assert_eq!(coalesced(&a), 0, "ACKs are no bulk burst");
}

/// A stream of 64 KiB WRITEs lands intact while the receiver coalesces.
/// Whether a given burst is bulk depends on how the two processes'
/// threads interleave (a receiver that keeps up takes one whole message
/// per burst), so the 4 MiB stream is repeated, up to 10 times, until the
/// receiver has coalesced.
#[test]
fn a_bulk_write_stream_lands_intact_while_the_receiver_coalesces() {
    let (a, b) = pair(["rc-a", "rc-b"], 20);
    let mut streams = 0;
    while streams < 10 && coalesced(&b) == 0 {
        write_stream(&a, &b);
        streams += 1;
        let t0 = Instant::now();
        while coalesced(&b) == 0 && t0.elapsed() < Duration::from_millis(50) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    println!("coalesced {} times in {streams} streams", coalesced(&b));
    assert!(coalesced(&b) > 0, "10 streams of 4 MiB never coalesced");
    assert_eq!(coalesced(&a), 0, "ACKs are no bulk burst");
}

/// 512 SENDs of 64 bytes wait in b's socket (its progress thread paused)
/// and are received in bursts of 32 KiB and more, of small packets: no
/// coalescing.
#[test]
fn a_burst_of_small_messages_does_not_coalesce() {
    const N: usize = 512;
    let (a, b) = pair(["rcs-a", "rcs-b"], 20);
    let device = b.ctx.soft_device().unwrap();
    device.pause_progress_thread(true);
    for i in 0..N {
        b.qp.post_recv(RecvWr {
            wr_id: i as u64,
            sg_list: vec![b.mr.sge(64 * i, 64)],
        })
        .unwrap();
    }
    for chunk in 0..N / 64 {
        let wrs: Vec<SendWr> = (0..64)
            .map(|i| {
                let k = chunk * 64 + i;
                SendWr::new(k as u64, SendOpcode::Send, vec![a.mr.sge(64 * k, 64)])
            })
            .collect();
        a.qp.post_send_list(wrs).map_err(|(_, e)| e).unwrap();
    }
    let before = b.ctx.stats().unwrap().driver;
    device.pause_progress_thread(false);
    let wcs = a.cq.poll_wait(N, T).unwrap();
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    let wcs = b.cq.poll_wait(N, T).unwrap();
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    let after = b.ctx.stats().unwrap().driver;
    let bursts = after.rx_batches - before.rx_batches;
    println!(
        "{} datagrams in {bursts} bursts",
        after.rx_datagrams - before.rx_datagrams
    );
    assert!(
        bursts < N as u64 / 8,
        "the SENDs waited together and came in large bursts"
    );
    assert_eq!(after.rx_coalesced, 0);
}

/// `n` 64 KiB WRITEs from `a` into `b`'s region as one post list.
fn write_whole(a: &Side, b: &Side, n: usize) {
    post_list(a, b, SendOpcode::RdmaWrite, n);
}

/// [`write_whole`] with `b`'s progress thread paused: loopback delivers
/// within the sender's system call, so they wait whole in its socket until
/// the thread is let go and receives them as one burst. Then `a` waits for
/// all `n` to complete.
fn write_burst(a: &Side, b: &Side, n: usize) {
    let device = b.ctx.soft_device().unwrap();
    device.pause_progress_thread(true);
    write_whole(a, b, n);
    device.pause_progress_thread(false);
    let wcs = a.cq.poll_wait(n, T).unwrap();
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
}

/// `n` 64 KiB `op`s (WRITE or READ) from `a` on slot `i` of both regions,
/// as one post list.
fn post_list(a: &Side, b: &Side, op: SendOpcode, n: usize) {
    let wrs: Vec<SendWr> = (0..n)
        .map(|i| {
            let mut wr = SendWr::new(i as u64, op, vec![a.mr.sge(i * SIZE, SIZE as u32)]);
            wr.remote_addr = b.mr.addr() + (i * SIZE) as u64;
            wr.rkey = b.mr.rkey();
            wr
        })
        .collect();
    a.qp.post_send_list(wrs).map_err(|(_, e)| e).unwrap();
}

/// One whole 64 KiB message per burst, as a ping-pong of large messages
/// receives, is no stream: its answer would come during the sleep.
#[test]
fn one_whole_message_does_not_coalesce() {
    let (a, b) = pair(["rcw-a", "rcw-b"], 20);
    for _ in 0..5 {
        write_burst(&a, &b, 1);
    }
    // A loaded machine may split one message over two bursts once (the
    // fresh-clone CI saw it once in many runs): that burst rightly
    // coalesces. Taking whole messages for a stream coalesces after each.
    let n = coalesced(&b);
    assert!(n <= 1, "{n} of 5 whole messages coalesced");
}

#[test]
fn with_coalescing_off_the_receiver_never_coalesces() {
    let (a, b) = pair(["rco-a", "rco-b"], 0);
    write_stream(&a, &b);
    assert_eq!(coalesced(&b), 0);
}

/// `b` coalesces for 2 s after a bulk burst (a setting only the
/// configuration struct allows: the environment's limit is 1 ms). With its
/// progress thread paused, two 64 KiB WRITEs wait whole in its socket; let
/// go, the thread receives them as one bulk burst, ACKs them and sleeps.
/// Arming b's CQ notification ends that sleep, so a SEND that arrives next
/// raises the event at once, not seconds later.
#[test]
fn arming_a_notification_ends_a_coalescing_sleep() {
    let (a, b) = pair(["rcn-a", "rcn-b"], 2_000_000);
    write_burst(&a, &b, 2);
    b.qp.post_recv(RecvWr {
        wr_id: 7,
        sg_list: vec![b.mr.sge(0, 64)],
    })
    .unwrap();
    b.cq.req_notify(false).unwrap();
    let t0 = Instant::now();
    a.qp.post_send(SendWr::new(8, SendOpcode::Send, vec![a.mr.sge(0, 64)]))
        .unwrap();
    let ev = b.channel.get_event_timeout(T).unwrap();
    let waited = t0.elapsed();
    println!("event after {waited:?}");
    assert_eq!(ev, Some(b.cq.id()));
    assert!(
        waited < Duration::from_secs(1),
        "the 2 s coalescing sleep ended when b armed its CQ ({waited:?})"
    );
    assert_eq!(coalesced(&b), 1, "b slept after the WRITE, and was woken");
    let wcs = b.cq.poll_wait(1, T).unwrap();
    assert_eq!((wcs[0].wr_id, wcs[0].status), (7, WcStatus::Success));
    let wcs = a.cq.poll_wait(1, T).unwrap();
    assert_eq!((wcs[0].wr_id, wcs[0].status), (8, WcStatus::Success));
}

fn caller_coalesced(s: &Side) -> u64 {
    s.ctx.stats().unwrap().driver.rx_caller_coalesced
}

/// `a` READs `n` 64 KiB messages from `b` as one post list and polls until
/// they complete. With `a`'s progress thread paused, its poll receives
/// them, as one burst: `b` has sent every response before the poll.
fn read_burst(a: &Side, b: &Side, n: usize) {
    let sent = |s: &Side| s.ctx.stats().unwrap().driver.tx_datagrams;
    let before = sent(b);
    post_list(a, b, SendOpcode::RdmaRead, n);
    let t0 = Instant::now();
    while sent(b) - before < (n * SIZE / 4096) as u64 && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(1));
    }
    let wcs = a.cq.poll_wait(n, T).unwrap();
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
}

/// A READ of 1 MiB from `a` to a third device that never answers it (its
/// progress thread paused), on a second QP of `a`'s: `a` is owed more
/// READ responses than any burst brings. Returns the third side, to be
/// let go at the end.
fn read_owed(a: &Side, name: &str) -> (Side, Qp) {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let shape = SideShape {
        cq_depth: 64,
        max_wr: 64,
        mr_len: 1 << 20,
        access,
    };
    let c = common::side(name, DeviceConfig::default(), &shape);
    let mut init = QpInit::new(QpType::Rc, &a.cq, &a.cq);
    init.cap.max_send_wr = 16;
    init.cap.max_recv_wr = 16;
    let qp = a._pd.create_qp(&init).unwrap();
    qp.connect(5, &c.qp.endpoint(6), Mtu::Mtu4096, access, 14)
        .unwrap();
    c.qp.connect(6, &qp.endpoint(5), Mtu::Mtu4096, access, 14)
        .unwrap();
    c.ctx.soft_device().unwrap().pause_progress_thread(true);
    let mut wr = SendWr::new(99, SendOpcode::RdmaRead, vec![a.mr.sge(0, 1 << 20)]);
    wr.remote_addr = c.mr.addr();
    wr.rkey = c.mr.rkey();
    qp.post_send(wr).unwrap();
    (c, qp)
}

/// Two bursts of four 64 KiB READ responses while the device is owed more
/// (a READ stream's requester): the caller's next poll sleeps out the
/// coalescing interval (200 ms here) before it receives.
#[test]
fn a_caller_polling_after_two_bulk_bursts_sleeps_before_receiving() {
    let (a, b) = pair(["rcc-a", "rcc-b"], 200_000);
    let (c, _qp) = read_owed(&a, "rcc-c");
    let device = a.ctx.soft_device().unwrap();
    device.pause_progress_thread(true);
    read_burst(&a, &b, 4);
    assert_eq!(caller_coalesced(&a), 0, "one bulk burst is no run");
    read_burst(&a, &b, 4);
    let t0 = Instant::now();
    let mut none = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 1];
    assert_eq!(a.cq.poll(&mut none).unwrap(), 0);
    let slept = t0.elapsed();
    println!("the poll took {slept:?}");
    assert_eq!(caller_coalesced(&a), 1);
    assert!(slept >= Duration::from_millis(50), "{slept:?}");
    device.pause_progress_thread(false);
    c.ctx.soft_device().unwrap().pause_progress_thread(false);
}

/// The same two bursts when they bring all the device's READs were owed:
/// nothing more is coming, and the caller does not sleep.
#[test]
fn a_caller_does_not_sleep_after_the_last_bursts_of_its_reads() {
    let (a, b) = pair(["rcr-a", "rcr-b"], 200_000);
    let device = a.ctx.soft_device().unwrap();
    device.pause_progress_thread(true);
    read_burst(&a, &b, 4);
    read_burst(&a, &b, 4);
    let t0 = Instant::now();
    let mut none = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 1];
    assert_eq!(a.cq.poll(&mut none).unwrap(), 0);
    println!("the poll took {:?}", t0.elapsed());
    assert_eq!(caller_coalesced(&a), 0);
    device.pause_progress_thread(false);
}

/// One whole 64 KiB READ response per burst (a READ latency run's): no
/// caller sleeps, nor with coalescing off after bulk bursts.
#[test]
fn a_caller_never_coalesces_one_message_at_a_time_or_with_coalescing_off() {
    let (a, b) = pair(["rcd-a", "rcd-b"], 200_000);
    let device = a.ctx.soft_device().unwrap();
    device.pause_progress_thread(true);
    for _ in 0..4 {
        read_burst(&a, &b, 1);
    }
    let mut none = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 1];
    assert_eq!(a.cq.poll(&mut none).unwrap(), 0);
    assert_eq!(caller_coalesced(&a), 0);
    device.pause_progress_thread(false);

    let (c, d) = pair(["rce-a", "rce-b"], 0);
    let device = c.ctx.soft_device().unwrap();
    device.pause_progress_thread(true);
    read_burst(&c, &d, 4);
    read_burst(&c, &d, 4);
    assert_eq!(c.cq.poll(&mut none).unwrap(), 0);
    assert_eq!(caller_coalesced(&c), 0);
    device.pause_progress_thread(false);
}
