//! Per-QP UDP source ports, as rxe and mlx5 send them (so ECMP and RSS
//! spread QPs over paths and queues): every packet of a QP leaves from one
//! port, never 4791; QPs spread over the device's pool of send sockets; the
//! peer checks each ICRC over the real source port (a wrong one would be
//! dropped, and nothing would complete).

mod common;

use common::open_with;
use roxe_verbs::wire::frame::Datagram;
use roxe_verbs::wire::pcap::{self, L3};
use roxe_verbs::wire::Packet;
use roxe_verbs::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

#[test]
fn each_qp_sends_from_one_port_of_a_pool() {
    let dir = std::env::temp_dir().join(format!("roxe-sport-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = dir.join("a.pcap");
    let a = open_with(
        "sport-a",
        DeviceConfig {
            pcap: Some(cap.clone()),
            ..DeviceConfig::default()
        },
    );
    let b = open_with("sport-b", DeviceConfig::default());
    let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        a.create_cq(256, None).unwrap(),
        b.create_cq(256, None).unwrap(),
    );
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr_a = pd_a.reg_mr(4096, access).unwrap();
    let mr_b = pd_b.reg_mr(4096, access).unwrap();
    const QPS: usize = 6;
    let mut qps = Vec::new();
    for i in 0..QPS as u32 {
        let qa = pd_a
            .create_qp(&QpInit::new(QpType::Rc, &cq_a, &cq_a))
            .unwrap();
        let qb = pd_b
            .create_qp(&QpInit::new(QpType::Rc, &cq_b, &cq_b))
            .unwrap();
        qa.connect(i, &qb.endpoint(100 + i), Mtu::Mtu1024, access, 14)
            .unwrap();
        qb.connect(100 + i, &qa.endpoint(i), Mtu::Mtu1024, access, 14)
            .unwrap();
        qps.push((qa, qb));
    }
    for round in 0..3u64 {
        for (i, (qa, _)) in qps.iter().enumerate() {
            let mut wr = SendWr::new(
                round * 100 + i as u64,
                SendOpcode::RdmaWrite,
                vec![mr_a.sge(0, 2048)],
            );
            wr.remote_addr = mr_b.addr();
            wr.rkey = mr_b.rkey();
            qa.post_send(wr).unwrap();
        }
    }
    let done = cq_a.poll_wait(3 * QPS, Duration::from_secs(5)).unwrap();
    assert_eq!(done.len(), 3 * QPS, "every WRITE completes");
    assert!(
        done.iter().all(|w| w.status == WcStatus::Success),
        "{done:?}"
    );
    drop(qps);
    // Everything sent is in the file (the device stays open: its PD, CQ
    // and MR still hold it).
    a.soft_device().expect("a soft device").flush_capture();

    // Requests from a, by destination QP (b's QPN): their source ports.
    let file = std::fs::File::open(&cap).unwrap();
    let reader = pcap::CaptureReader::new(std::io::BufReader::new(file)).unwrap();
    let mut ports: BTreeMap<u32, BTreeSet<u16>> = BTreeMap::new();
    for rec in reader {
        let rec = rec.unwrap();
        let Some(L3::Ipv4(ip) | L3::Ipv6(ip)) = pcap::link_payload(rec.link, &rec.data) else {
            continue;
        };
        let dg = Datagram::parse(ip).unwrap();
        let pkt = Packet::new_checked(dg.payload).unwrap();
        if !pkt.opcode().is_response() && pkt.bth().dest_qp() != 1 {
            ports
                .entry(pkt.bth().dest_qp())
                .or_default()
                .insert(dg.src_port);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(ports.len(), QPS, "{ports:?}");
    for (qpn, p) in &ports {
        assert_eq!(p.len(), 1, "QP {qpn:#x} sent from several ports: {p:?}");
        assert!(!p.contains(&4791), "QP {qpn:#x} sent from 4791");
    }
    let distinct: BTreeSet<u16> = ports.values().flatten().copied().collect();
    assert_eq!(
        distinct.len(),
        QPS,
        "consecutive QPs take different ports: {ports:?}"
    );
}
