//! Memory windows through the Rust API between two soft devices: a type 1
//! window bound with `Qp::bind_mw`, rebound and unbound; a type 2 window
//! bound with a BIND_MW work request and ended by the peer's
//! SEND_WITH_INV, which the receive completion reports.

mod common;

use common::open;
use roxe_verbs::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

struct Side {
    qp: Qp,
    cq: Cq,
    pd: Pd,
    mr: Mr,
}

fn pair(na: &str, nb: &str) -> (Side, Side, Context, Context) {
    let (a, b) = (open(na), open(nb));
    let side = |ctx: &Context| {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        let mr = pd.reg_mr(8192, access).unwrap();
        Side { qp, cq, pd, mr }
    };
    let (sa, sb) = (side(&a), side(&b));
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    sa.qp
        .connect(1, &sb.qp.endpoint(2), Mtu::Mtu1024, access, 14)
        .unwrap();
    sb.qp
        .connect(2, &sa.qp.endpoint(1), Mtu::Mtu1024, access, 14)
        .unwrap();
    (sa, sb, a, b)
}

fn one(s: &Side) -> WorkCompletion {
    let wcs = s.cq.poll_wait(1, T).unwrap();
    assert_eq!(wcs.len(), 1, "one completion in time");
    wcs[0]
}

/// A signaled WRITE of 64 bytes from `a` to `va` through `rkey`.
fn write(a: &Side, va: u64, rkey: u32) -> WcStatus {
    let mut wr = SendWr::new(9, SendOpcode::RdmaWrite, vec![a.mr.sge(0, 64)]);
    wr.remote_addr = va;
    wr.rkey = rkey;
    a.qp.post_send(wr).unwrap();
    one(a).status
}

#[test]
fn type1_window_bound_rebound_and_unbound() {
    let (a, b, _ca, _cb) = pair("mw1-a", "mw1-b");
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    assert_eq!(mw.mw_type(), MwType::Type1);
    let before = mw.rkey();
    let rw = AccessFlags::REMOTE_WRITE;
    let key =
        b.qp.bind_mw(
            &mw,
            Some(&b.mr),
            b.mr.addr(),
            4096,
            rw,
            1,
            SendFlags::SIGNALED,
        )
        .unwrap();
    let done = one(&b);
    assert_eq!(
        (done.opcode, done.status),
        (WcOpcode::BindMw, WcStatus::Success)
    );
    assert_eq!(mw.rkey(), key);
    assert_ne!(key, before);
    a.mr.write(0, &[7u8; 64]).unwrap();
    assert_eq!(write(&a, b.mr.addr() + 100, key), WcStatus::Success);
    let mut got = [0u8; 64];
    b.mr.read(100, &mut got).unwrap();
    assert_eq!(got, [7u8; 64]);
    // Unbound: the key stops working (and a's QP goes to ERR).
    b.qp.bind_mw(&mw, None, 0, 0, AccessFlags::NONE, 2, SendFlags::SIGNALED)
        .unwrap();
    assert_eq!(one(&b).status, WcStatus::Success);
    assert_eq!(
        write(&a, b.mr.addr() + 100, mw.rkey()),
        WcStatus::RemAccessErr
    );
    // libibverbs' checks: a type 2 window, a range without an MR.
    let mw2 = b.pd.alloc_mw(MwType::Type2).unwrap();
    let e =
        b.qp.bind_mw(
            &mw2,
            Some(&b.mr),
            b.mr.addr(),
            64,
            rw,
            3,
            SendFlags::SIGNALED,
        )
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let e =
        b.qp.bind_mw(&mw, None, 64, 64, rw, 3, SendFlags::SIGNALED)
            .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
}

#[test]
fn type2_window_ended_by_send_with_invalidate() {
    let (a, b, _ca, _cb) = pair("mw2-a", "mw2-b");
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let rw = AccessFlags::REMOTE_WRITE;
    let wr = mw.bind_wr(5, &b.mr, b.mr.addr() + 4096, 4096, rw);
    let key = mw.next_rkey();
    b.qp.post_send(wr).unwrap();
    let done = one(&b);
    assert_eq!(
        (done.opcode, done.status, done.wr_id),
        (WcOpcode::BindMw, WcStatus::Success, 5)
    );
    assert_eq!(mw.rkey(), key);
    assert_eq!(write(&a, b.mr.addr() + 4096, key), WcStatus::Success);
    // The peer ends the window with its SEND.
    b.qp.post_recv(RecvWr {
        wr_id: 6,
        sg_list: vec![b.mr.sge(0, 256)],
    })
    .unwrap();
    let mut inv = SendWr::new(7, SendOpcode::SendWithInv, vec![a.mr.sge(0, 32)]);
    inv.invalidate_rkey = key;
    a.qp.post_send(inv).unwrap();
    assert_eq!(one(&a).status, WcStatus::Success);
    let rx = one(&b);
    assert_eq!(
        (rx.wr_id, rx.status, rx.byte_len),
        (6, WcStatus::Success, 32)
    );
    assert_eq!(rx.wc_flags & wc_flags::WITH_INV, wc_flags::WITH_INV);
    assert_eq!(rx.invalidated_rkey, key);
    assert_eq!(write(&a, b.mr.addr() + 4096, key), WcStatus::RemAccessErr);
}
