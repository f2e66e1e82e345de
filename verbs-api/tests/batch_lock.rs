//! A pass's batch of packets leaves after the device lock is released,
//! under a lock of its own (held here by `Device::hold_batch`, as a
//! thread in `sendmmsg` holds it): a poll that sends nothing does not wait
//! for it, and a deregistration does, since the batch may carry payloads
//! by reference from the region.

mod common;

use roxe_verbs::*;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
/// How long the helper thread holds the batch lock.
const HOLD: Duration = Duration::from_millis(400);

struct Pair {
    a: Context,
    qa: Qp,
    ca: Cq,
    ch: CompChannel,
    ma: Mr,
    mb: Mr,
    _keep: (Context, Qp, Cq, Pd, Pd),
}

fn pair(names: [&str; 2]) -> Pair {
    let (a, b) = (common::open(names[0]), common::open(names[1]));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let ch = a.create_comp_channel().unwrap();
    let ca = a.create_cq(16, Some(&ch)).unwrap();
    let cb = b.create_cq(16, None).unwrap();
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb)).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let ma = pa.reg_mr(4096, access).unwrap();
    let mb = pb.reg_mr(4096, access).unwrap();
    qa.connect(1, &qb.endpoint(2), Mtu::Mtu1024, access, 14)
        .unwrap();
    qb.connect(2, &qa.endpoint(1), Mtu::Mtu1024, access, 14)
        .unwrap();
    Pair {
        a,
        qa,
        ca,
        ch,
        ma,
        mb,
        _keep: (b, qb, cb, pa, pb),
    }
}

/// Hold `ctx`'s batch lock on another thread for [`HOLD`], run `f` once
/// it is held, and return how long `f` took.
fn with_batch_held(ctx: &Context, f: impl FnOnce()) -> Duration {
    let device = ctx.soft_device().unwrap();
    let (held_tx, held_rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let hold = device.hold_batch();
            held_tx.send(()).unwrap();
            std::thread::sleep(HOLD);
            drop(hold);
        });
        held_rx.recv_timeout(T).unwrap();
        let t0 = Instant::now();
        f();
        t0.elapsed()
    })
}

#[test]
fn a_poll_does_not_wait_for_the_batch_in_flight() {
    let p = pair(["bl-a", "bl-b"]);
    p.ca.req_notify(false).unwrap();
    let mut wr = SendWr::new(9, SendOpcode::RdmaWrite, vec![p.ma.sge(0, 64)]);
    wr.remote_addr = p.mb.addr();
    wr.rkey = p.mb.rkey();
    p.qa.post_send(wr).unwrap();
    // The completion waits in the CQ: the poll takes the engine and runs a
    // pass, which has nothing to send.
    assert_eq!(p.ch.get_event_timeout(T).unwrap(), Some(p.ca.id()));
    let mut wcs = Vec::new();
    let took = with_batch_held(&p.a, || wcs = p.ca.poll_wait(1, T).unwrap());
    println!("the poll took {took:?}");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (9, WcStatus::Success));
    assert!(took < HOLD / 2, "the poll waited for the batch ({took:?})");
}

#[test]
fn a_deregistration_waits_for_the_batch_in_flight() {
    let p = pair(["bm-a", "bm-b"]);
    let Pair { a, ma, .. } = p;
    let took = with_batch_held(&a, move || drop(ma));
    println!("the deregistration took {took:?}");
    assert!(
        took >= HOLD / 2,
        "the region was deregistered while the batch was held ({took:?})"
    );
}
