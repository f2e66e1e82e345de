//! Tag matching through the Rust API between two soft devices over
//! loopback sockets: `b`'s RC QP sits on a tag-matching SRQ; `a` sends an
//! EAGER message to a posted tag, an unexpected one, and a rendezvous that
//! `b` completes by READing `a`'s buffer and answering with a FIN.

mod common;

use common::open;
use roxe_verbs::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

fn tmh(op: u8, ctx: u32, tag: u64) -> Vec<u8> {
    Tmh {
        op,
        app_ctx: ctx,
        tag,
    }
    .to_bytes()
    .to_vec()
}

#[test]
fn eager_unexpected_and_rendezvous_over_sockets() {
    let (a, b) = (open("tm-a"), open("tm-b"));
    let caps = b.tm_caps();
    assert!(caps.rc && caps.max_num_tags > 0 && caps.max_rndv_hdr_size >= 32);
    let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        a.create_cq(64, None).unwrap(),
        b.create_cq(64, None).unwrap(),
    );
    let srq = pd_b.create_tm_srq(&cq_b, 16, 1, 8).unwrap();
    let qa = pd_a
        .create_qp(&QpInit::new(QpType::Rc, &cq_a, &cq_a))
        .unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq_b, &cq_b);
    init.srq = Some(&srq);
    let qb = pd_b.create_qp(&init).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    qa.connect(1, &qb.endpoint(2), Mtu::Mtu1024, access, 14)
        .unwrap();
    qb.connect(2, &qa.endpoint(1), Mtu::Mtu1024, access, 14)
        .unwrap();
    let mr_a = pd_a.reg_mr(1 << 16, access).unwrap();
    let mr_b = pd_b.reg_mr(1 << 16, access).unwrap();
    srq.post_recv(RecvWr {
        wr_id: 100,
        sg_list: vec![mr_b.sge(0x8000, 4096)],
    })
    .unwrap();
    let add = |tag: u64, offset: usize, len: u32| {
        srq.post_op(SrqOp {
            wr_id: 1000 + tag,
            kind: SrqOpKind::Add {
                recv_wr_id: tag,
                sg_list: vec![mr_b.sge(offset, len)],
                tag,
                mask: u64::MAX,
            },
            signaled: true,
            sync: None,
        })
        .unwrap()
    };
    let send = |wr_id: u64, msg: &[u8]| {
        mr_a.write(0, msg).unwrap();
        qa.post_send(SendWr::new(
            wr_id,
            SendOpcode::Send,
            vec![mr_a.sge(0, msg.len() as u32)],
        ))
        .unwrap();
    };

    // EAGER to tag 5: 2,500 bytes after the TMH land in the tag's buffer.
    add(5, 0, 4096);
    let w = cq_b.poll_wait(1, T).unwrap();
    assert_eq!((w[0].wr_id, w[0].opcode), (1005, WcOpcode::TmAdd));
    let body: Vec<u8> = (0..2500u32).map(|i| (i * 7) as u8).collect();
    let mut msg = tmh(tmh_op::EAGER, 4, 5);
    msg.extend_from_slice(&body);
    send(1, &msg);
    let w = cq_b.poll_wait(1, T).unwrap();
    assert_eq!(
        (w[0].wr_id, w[0].status, w[0].opcode, w[0].byte_len),
        (5, WcStatus::Success, WcOpcode::TmRecv, 2500)
    );
    assert_eq!(w[0].wc_flags, wc_flags::TM_MATCH | wc_flags::TM_DATA_VALID);
    assert_eq!((w[0].tm_tag, w[0].tm_priv), (5, 4));
    let mut got = vec![0u8; 2500];
    mr_b.read(0, &mut got).unwrap();
    assert_eq!(got, body);
    assert_eq!(cq_a.poll_wait(1, T).unwrap()[0].status, WcStatus::Success);

    // No tag 6 posted: unexpected, the whole message in the ordinary receive.
    let msg = tmh(tmh_op::EAGER, 0, 6);
    send(2, &msg);
    let w = cq_b.poll_wait(1, T).unwrap();
    assert_eq!(
        (w[0].wr_id, w[0].opcode, w[0].wc_flags, w[0].byte_len),
        (100, WcOpcode::TmRecv, 0, 16)
    );
    cq_a.poll_wait(1, T).unwrap();
    srq.post_op(SrqOp {
        wr_id: 7,
        kind: SrqOpKind::Sync,
        signaled: true,
        sync: Some(1),
    })
    .unwrap();
    let w = cq_b.poll_wait(1, T).unwrap();
    assert_eq!((w[0].opcode, w[0].wc_flags), (WcOpcode::TmSync, 0));

    // Rendezvous to tag 9: b reads 10,000 bytes of a's, then a gets a FIN.
    add(9, 0x4000, 16384);
    cq_b.poll_wait(1, T).unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 + 1) as u8).collect();
    mr_a.write(0x2000, &data).unwrap();
    qa.post_recv(RecvWr {
        wr_id: 50,
        sg_list: vec![mr_a.sge(0x9000, 64)],
    })
    .unwrap();
    let mut rndv = tmh(tmh_op::RNDV, 3, 9);
    rndv.extend_from_slice(&(mr_a.addr() + 0x2000).to_be_bytes());
    rndv.extend_from_slice(&mr_a.rkey().to_be_bytes());
    rndv.extend_from_slice(&10_000u32.to_be_bytes());
    send(3, &rndv);
    let w = cq_b.poll_wait(2, T).unwrap();
    let seen: Vec<_> = w
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.wc_flags, w.byte_len))
        .collect();
    assert_eq!(
        seen,
        [
            (
                9,
                WcStatus::Success,
                WcOpcode::TmRecv,
                wc_flags::TM_MATCH,
                0
            ),
            (
                9,
                WcStatus::Success,
                WcOpcode::TmRecv,
                wc_flags::TM_DATA_VALID,
                10_000
            ),
        ]
    );
    let mut got = vec![0u8; 10_000];
    mr_b.read(0x4000, &mut got).unwrap();
    assert_eq!(got, data);
    let mut w = cq_a.poll_wait(2, T).unwrap();
    w.sort_by_key(|w| w.wr_id);
    assert_eq!((w[0].wr_id, w[0].opcode), (3, WcOpcode::Send));
    assert_eq!(
        (w[1].wr_id, w[1].opcode, w[1].byte_len),
        (50, WcOpcode::Recv, 16)
    );
    let mut fin = vec![0u8; 16];
    mr_a.read(0x9000, &mut fin).unwrap();
    assert_eq!(fin, tmh(tmh_op::FIN, 3, 9));
}
