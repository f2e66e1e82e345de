//! Asynchronous QP events through the Rust API: a QP moved to SQD with
//! `en_sqd_async_notify` reports SQ_DRAINED; a QP on an SRQ going to ERR
//! reports LAST_WQE_REACHED; nothing else is raised.

mod common;

use common::open;
use roxe_verbs::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

#[test]
fn sq_drained_and_last_wqe_reached() {
    let (a, b) = (open("async-a"), open("async-b"));
    let events = a.async_events().unwrap();
    events.set_nonblocking(true).unwrap();
    assert_eq!(
        events.get().unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "no event before anything happened"
    );
    events.set_nonblocking(false).unwrap();

    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (
        a.create_cq(16, None).unwrap(),
        b.create_cq(16, None).unwrap(),
    );
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb)).unwrap();
    let access = AccessFlags::LOCAL_WRITE;
    qa.connect(1, &qb.endpoint(2), Mtu::Mtu1024, access, 14)
        .unwrap();
    qb.connect(2, &qa.endpoint(1), Mtu::Mtu1024, access, 14)
        .unwrap();

    let sqd = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    qa.modify(&sqd, AttrMask::STATE | AttrMask::EN_SQD_ASYNC_NOTIFY)
        .unwrap();
    let ev = events.get_timeout(T).unwrap().expect("an SQ_DRAINED event");
    assert_eq!(
        ev,
        QpEvent {
            qpn: qa.qp_num(),
            event_type: QpEvent::SQ_DRAINED
        }
    );

    // A QP on an SRQ: INIT, then ERR.
    let srq = pa.create_srq(8, 1).unwrap();
    let mut init = QpInit::new(QpType::Rc, &ca, &ca);
    init.srq = Some(&srq);
    let qs = pa.create_qp(&init).unwrap();
    let to_init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    qs.modify(
        &to_init,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    let to_err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    qs.modify(&to_err, AttrMask::STATE).unwrap();
    let ev = events
        .get_timeout(T)
        .unwrap()
        .expect("a LAST_WQE_REACHED event");
    assert_eq!(
        ev,
        QpEvent {
            qpn: qs.qp_num(),
            event_type: QpEvent::LAST_WQE_REACHED
        }
    );
    assert_eq!(
        events.get_timeout(Duration::from_millis(100)).unwrap(),
        None,
        "nothing else"
    );
}
