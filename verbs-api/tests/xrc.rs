//! XRC through the Rust API between two soft devices over loopback
//! sockets: one XRC_SEND QP on `a` reaches two XRC SRQs of one domain on
//! `b` through one XRC_RECV QP; each WR's remote SRQ number picks the SRQ,
//! whose CQ completes the receive and whose PD governs the RDMA.

mod common;

use common::open;
use roxe_verbs::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

#[test]
fn xrc_sends_writes_and_reads_reach_the_named_srq() {
    let (a, b) = (open("xrc-a"), open("xrc-b"));
    let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let cq_a = a.create_cq(64, None).unwrap();
    let send = pd_a
        .create_qp(&QpInit::new(QpType::XrcSend, &cq_a, &cq_a))
        .unwrap();
    assert_eq!(send.qp_type(), QpType::XrcSend);
    let xrcd = b.open_xrcd().unwrap();
    let (cq1, cq2) = (
        b.create_cq(64, None).unwrap(),
        b.create_cq(64, None).unwrap(),
    );
    let srq1 = pd_b.create_xrc_srq(&xrcd, &cq1, 16, 1).unwrap();
    let srq2 = pd_b.create_xrc_srq(&xrcd, &cq2, 16, 1).unwrap();
    assert_ne!(srq1.number().unwrap(), srq2.number().unwrap());
    let recv = xrcd.create_recv_qp().unwrap();
    // An XRC_RECV QP cannot come from a PD.
    assert!(pd_b
        .create_qp(&QpInit::new(QpType::XrcRecv, &cq1, &cq1))
        .is_err());
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    send.connect(7, &recv.endpoint(9), Mtu::Mtu1024, access, 14)
        .unwrap();
    recv.connect(9, &send.endpoint(7), Mtu::Mtu1024, access, 14)
        .unwrap();
    assert_eq!(recv.query().unwrap().qp_state, QpState::Rts);

    let mr_a = pd_a.reg_mr(16384, access).unwrap();
    let mr_b = pd_b.reg_mr(16384, access).unwrap();
    let msg: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
    mr_a.write(0, &msg).unwrap();
    srq1.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![mr_b.sge(0, 4096)],
    })
    .unwrap();
    srq2.post_recv(RecvWr {
        wr_id: 2,
        sg_list: vec![mr_b.sge(4096, 4096)],
    })
    .unwrap();
    // A 3000-byte SEND (three packets at MTU 1024) to each SRQ, then a
    // WRITE and a READ through srq2's PD.
    for (wr_id, srq) in [(10, &srq2), (11, &srq1)] {
        let mut wr = SendWr::new(wr_id, SendOpcode::Send, vec![mr_a.sge(0, 3000)]);
        wr.xrc_remote_srqn = srq.number().unwrap();
        send.post_send(wr).unwrap();
    }
    let mut write = SendWr::new(12, SendOpcode::RdmaWrite, vec![mr_a.sge(0, 2000)]);
    write.remote_addr = mr_b.addr() + 8192;
    write.rkey = mr_b.rkey();
    write.xrc_remote_srqn = srq2.number().unwrap();
    send.post_send(write).unwrap();
    let mut read = SendWr::new(13, SendOpcode::RdmaRead, vec![mr_a.sge(12288, 2000)]);
    read.remote_addr = mr_b.addr() + 8192;
    read.rkey = mr_b.rkey();
    read.xrc_remote_srqn = srq2.number().unwrap();
    send.post_send(read).unwrap();

    let sent = cq_a.poll_wait(4, T).unwrap();
    let got: Vec<_> = sent.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        [
            (10, WcStatus::Success),
            (11, WcStatus::Success),
            (12, WcStatus::Success),
            (13, WcStatus::Success)
        ]
    );
    for (cq, wr_id) in [(&cq2, 2), (&cq1, 1)] {
        let wc = cq.poll_wait(1, T).unwrap();
        assert_eq!(wc.len(), 1, "one receive at SRQ of wr {wr_id}");
        assert_eq!(
            (wc[0].wr_id, wc[0].status, wc[0].byte_len, wc[0].qp_num),
            (wr_id, WcStatus::Success, 3000, recv.qp_num())
        );
    }
    let mut out = vec![0u8; 3000];
    for off in [0, 4096] {
        mr_b.read(off, &mut out).unwrap();
        assert_eq!(out, msg);
    }
    let mut back = vec![0u8; 2000];
    mr_a.read(12288, &mut back).unwrap();
    assert_eq!(back, msg[..2000]);
}
