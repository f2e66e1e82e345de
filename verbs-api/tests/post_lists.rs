//! Through the Rust API: `Qp::post_send_list` posts in order and stops at
//! the first refused work request (as `bad_wr` does), and
//! `Cq::poll_with_wallclock` gives each completion the wall-clock time the
//! device made it at (between the post and the poll, never backwards).

mod common;

use common::open;
use roxe_verbs::*;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const T: Duration = Duration::from_secs(10);

struct Side {
    qp: Qp,
    cq: Cq,
    mr: Mr,
    _pd: Pd,
    _ctx: Context,
}

fn pair(na: &str, nb: &str) -> (Side, Side) {
    let side = |ctx: Context| {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None).unwrap();
        let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = pd.reg_mr(65536, access).unwrap();
        Side {
            qp,
            cq,
            mr,
            _pd: pd,
            _ctx: ctx,
        }
    };
    let (a, b) = (side(open(na)), side(open(nb)));
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    a.qp.connect(1, &b.qp.endpoint(2), Mtu::Mtu1024, access, 14)
        .unwrap();
    b.qp.connect(2, &a.qp.endpoint(1), Mtu::Mtu1024, access, 14)
        .unwrap();
    (a, b)
}

fn write(a: &Side, b: &Side, wr_id: u64, off: usize) -> SendWr {
    let mut wr = SendWr::new(wr_id, SendOpcode::RdmaWrite, vec![a.mr.sge(off, 64)]);
    wr.remote_addr = b.mr.addr() + off as u64;
    wr.rkey = b.mr.rkey();
    wr
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[test]
fn a_list_is_posted_in_order_up_to_the_first_refusal() {
    let (a, b) = pair("pl-a", "pl-b");
    let data: Vec<u8> = (0..64 * 8).map(|i| (i * 7 % 251) as u8).collect();
    a.mr.write(0, &data).unwrap();
    // Eight WRITEs; the sixth has more SGEs than the QP allows.
    let mut list: Vec<SendWr> = (0..8)
        .map(|i| write(&a, &b, 100 + i, 64 * i as usize))
        .collect();
    list[5].sg_list = vec![a.mr.sge(0, 1); 16];
    match a.qp.post_send_list(list) {
        Err((5, e)) => assert_eq!(e.errno(), Errno::EINVAL.0, "{e}"),
        other => panic!("expected the sixth WR refused, got {other:?}"),
    }
    // The five before it ran, in order; nothing after it.
    let wcs = a.cq.poll_wait(5, T).unwrap();
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [100, 101, 102, 103, 104]);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    std::thread::sleep(Duration::from_millis(100));
    let mut more = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 4];
    assert_eq!(a.cq.poll(&mut more).unwrap(), 0, "{more:?}");
    let mut landed = vec![0u8; 64 * 8];
    b.mr.read(0, &mut landed).unwrap();
    assert_eq!(landed[..64 * 5], data[..64 * 5]);
    assert!(landed[64 * 5..].iter().all(|&x| x == 0));
}

#[test]
fn completions_carry_the_wall_clock_time_they_were_made_at() {
    let (a, b) = pair("wc-a", "wc-b");
    let before = wall_ns();
    let list: Vec<SendWr> = (0..16).map(|i| write(&a, &b, i, 64 * i as usize)).collect();
    a.qp.post_send_list(list).unwrap();
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + T;
    while got.len() < 16 && std::time::Instant::now() < deadline {
        let mut wcs = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 16];
        let mut at = [0u64; 16];
        let n = a.cq.poll_with_wallclock(&mut wcs, &mut at).unwrap();
        got.extend(at[..n].iter().copied());
    }
    let after = wall_ns();
    assert_eq!(got.len(), 16, "all completions in time");
    // The device anchored its clock to the wall clock once, when it
    // opened: allow 50 ms either way.
    let slack = 50_000_000;
    assert!(
        got.iter()
            .all(|&t| t + slack >= before && t <= after + slack),
        "times {got:?} not within [{before}, {after}]"
    );
    assert!(got.windows(2).all(|w| w[0] <= w[1]), "{got:?}");
}
