//! `Qp::connect_with_outstanding`: the READs and atomics outstanding each
//! way are what the QP reports, and more than the device allows is
//! refused with EINVAL (as `ibv_modify_qp`), leaving the QP unconnected.

mod common;

use roxe_verbs::*;

fn qp(ctx: &Context) -> (Pd, Cq, Qp) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    (pd, cq, qp)
}

#[test]
fn outstanding_reads_are_set_and_bounded() {
    let a = common::open("co-a");
    let b = common::open("co-b");
    let (_pa, _ca, qa) = qp(&a);
    let (_pb, _cb, qb) = qp(&b);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let max = a.query_device().max_qp_rd_atom;
    assert_eq!(max, 128, "as rxe");
    let e = qa
        .connect_with_outstanding(1, &qb.endpoint(2), Mtu::Mtu1024, access, 14, 129)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert_ne!(qa.query().unwrap().qp_state, QpState::Rts);
    qa.connect_with_outstanding(1, &qb.endpoint(2), Mtu::Mtu1024, access, 14, 64)
        .unwrap();
    let attr = qa.query().unwrap();
    assert_eq!(attr.qp_state, QpState::Rts);
    assert_eq!((attr.max_rd_atomic, attr.max_dest_rd_atomic), (64, 64));
    qb.connect(2, &qa.endpoint(1), Mtu::Mtu1024, access, 14)
        .unwrap();
    let attr = qb.query().unwrap();
    assert_eq!((attr.max_rd_atomic, attr.max_dest_rd_atomic), (16, 16));
}
