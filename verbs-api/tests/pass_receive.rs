//! A transmit pass that sends more than one batch receives between its
//! batches (`Shared::receive_in_pass`): an ACK or NAK that arrives while a
//! window of packets goes out is handled before the next batch, not after
//! the whole pass.
//!
//! The test: `b` sends `a` a SEND while `a`'s progress thread is paused
//! and `a` does not poll, so the SEND waits in `a`'s socket. Then `a`
//! posts a list of 64 KiB WRITEs (a post list is sent at once, in `a`'s
//! thread: 256 packets, four batches). That pass receives the waiting
//! SEND between its batches.

mod common;

use common::{connect_sides, Side, SideShape};
use roxe_verbs::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);
const SIZE: usize = 65536;
const WRITES: u64 = 16;
const ACCESS: AccessFlags = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0);

fn side(name: &str) -> Side {
    let shape = SideShape {
        cq_depth: 64,
        max_wr: 32,
        mr_len: SIZE * WRITES as usize,
        access: ACCESS,
    };
    common::side(name, DeviceConfig::default(), &shape)
}

fn in_pass(s: &Side) -> u64 {
    s.ctx.stats().unwrap().driver.rx_in_pass
}

#[test]
fn a_long_pass_receives_between_its_batches() {
    let (a, b) = (side("pass-rx-a"), side("pass-rx-b"));
    let window = a
        .ctx
        .soft_device()
        .unwrap()
        .engine()
        .config()
        .loopback_window;
    if window <= 64 {
        // A small socket buffer (no CAP_NET_ADMIN, a distribution's
        // rmem_max) narrows the window below one batch: no pass is long.
        eprintln!("skipped: the loopback window is {window} PSNs, not more than one batch");
        return;
    }
    connect_sides(&a, &b, ACCESS, 20);
    a.ctx.soft_device().unwrap().pause_progress_thread(true);
    a.qp.post_recv(RecvWr {
        wr_id: 100,
        sg_list: vec![a.mr.sge(0, 64)],
    })
    .unwrap();
    b.mr.write(0, b"waiting in a's socket").unwrap();
    b.qp.post_send(SendWr::new(7, SendOpcode::Send, vec![b.mr.sge(0, 64)]))
        .unwrap();
    // On loopback the datagram is queued to a's socket within b's send
    // call; the pause leaves it there (nobody at a receives).
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(in_pass(&a), 0);
    let writes = (0..WRITES).map(|i| {
        let at = i as usize * SIZE;
        let mut wr = SendWr::new(i, SendOpcode::RdmaWrite, vec![a.mr.sge(at, SIZE as u32)]);
        wr.remote_addr = b.mr.addr() + at as u64;
        wr.rkey = b.mr.rkey();
        wr
    });
    a.qp.post_send_list(writes).unwrap();
    assert!(
        in_pass(&a) >= 1,
        "the post list's pass received the waiting SEND between its batches"
    );
    a.ctx.soft_device().unwrap().pause_progress_thread(false);
    let mut got = Vec::new();
    while got.len() < WRITES as usize + 1 {
        got.extend(a.cq.poll_wait(1, T).unwrap());
    }
    for wc in &got {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    let recv = got
        .iter()
        .find(|w| w.wr_id == 100)
        .expect("the SEND arrived");
    assert_eq!(recv.byte_len, 64);
    let mut text = [0u8; 21];
    a.mr.read(0, &mut text).unwrap();
    assert_eq!(&text, b"waiting in a's socket");
    assert_eq!(b.cq.poll_wait(1, T).unwrap()[0].status, WcStatus::Success);
}
