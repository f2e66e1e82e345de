//! Objects of one soft device handed to a verb of another: refused with
//! EINVAL, as the kernel refuses handles of another context. The engine
//! ids they carry name other objects, or none, on the other device.

mod common;

use common::open;
use roxe_verbs::*;

#[test]
fn cqs_srqs_and_xrc_domains_of_another_device_are_refused() {
    let (a, b) = (open("foreign-a"), open("foreign-b"));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(8, None).unwrap(), b.create_cq(8, None).unwrap());
    let errno = |r: Result<Qp>| r.err().map(|e| e.errno());
    // The same ids exist on both devices: without the check each would
    // name the other device's CQ.
    assert_eq!(
        errno(pb.create_qp(&QpInit::new(QpType::Rc, &ca, &cb))),
        Some(libc::EINVAL)
    );
    assert_eq!(
        errno(pb.create_qp(&QpInit::new(QpType::Rc, &cb, &ca))),
        Some(libc::EINVAL)
    );
    let srq_a = pa.create_srq(8, 1).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cb, &cb);
    init.srq = Some(&srq_a);
    assert_eq!(errno(pb.create_qp(&init)), Some(libc::EINVAL));
    let srq_errno = |r: Result<Srq>| r.err().map(|e| e.errno());
    let xa = a.open_xrcd().unwrap();
    assert_eq!(
        srq_errno(pb.create_xrc_srq(&xa, &cb, 8, 1)),
        Some(libc::EINVAL)
    );
    let xb = b.open_xrcd().unwrap();
    assert_eq!(
        srq_errno(pb.create_xrc_srq(&xb, &ca, 8, 1)),
        Some(libc::EINVAL)
    );
    // Each device's own objects work.
    pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb)).unwrap();
    pb.create_xrc_srq(&xb, &cb, 8, 1).unwrap();
    pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca)).unwrap();
}
