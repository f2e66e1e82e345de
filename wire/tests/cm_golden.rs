//! The CM MADs of the real rdma_cm captures (Linux 6.1 rxe, rdma-core 44):
//! every UD packet to QP 1 parses as a CM MAD with the values Wireshark
//! printed (`shared/docs/cm-mads-rxe.txt`) and re-emits to the same 256
//! bytes.
//!
//! Where Wireshark 4.0 is wrong the kernel's layout wins, with independent
//! evidence: Wireshark reads a REQ path's flow label from 3 bytes and its
//! packet rate from the flow label's first byte (so it prints flow label
//! 0x00951, reserved 0x02, rate 0x15 for rping). The kernel
//! (`ibta_vol1_c12.h`) has a 20-bit flow label, 6 reserved bits and a 6-bit
//! rate in one big-endian word: 0x95179, 0, 0 (`IB_RATE_PORT_CURRENT`). The
//! UDP source port of the connection's RC packets is
//! `rdma_flow_label_to_udp_sport(0x95179)` = 53596, which the test checks.

use roxe_wire::cm::{
    self, attr, rdma_cm, CmMad, CmMessage, DreqRepr, MadHeaderRepr, PathRepr, RepRepr, ReqRepr,
};
use roxe_wire::frame::Datagram;
use roxe_wire::pcap::{self, L3};
use roxe_wire::PacketRepr;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 47, 91, 12);
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 47, 91, 11);

/// One CM MAD of a capture.
struct Mad {
    frame: u64,
    src: IpAddr,
    dst: IpAddr,
    mad: CmMad,
}

/// Everything the tests need from one capture.
struct Capture {
    mads: Vec<Mad>,
    /// UDP source ports of the non-QP1 packets, by destination QP.
    data_ports: BTreeMap<u32, BTreeSet<u16>>,
}

fn golden(name: &str) -> Option<PathBuf> {
    let shared = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/golden/rxe/");
    let p = PathBuf::from(shared).join(name);
    if p.is_file() {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must have {} (../shared/golden/rxe)",
        p.display()
    );
    eprintln!("SKIP: {} not available", p.display());
    None
}

fn read(name: &str) -> Option<Capture> {
    let path = golden(name)?;
    let mut c = Capture {
        mads: Vec::new(),
        data_ports: BTreeMap::new(),
    };
    let file = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
    for rec in pcap::CaptureReader::new(file).unwrap() {
        let rec = rec.unwrap();
        let ip = match pcap::link_payload(rec.link, &rec.data) {
            Some(L3::Ipv4(b)) | Some(L3::Ipv6(b)) => b,
            _ => continue,
        };
        let dg = Datagram::parse(ip).unwrap();
        let p = PacketRepr::parse_bytes(dg.payload).unwrap();
        if p.bth.dest_qp != cm::GSI_QPN {
            c.data_ports
                .entry(p.bth.dest_qp)
                .or_default()
                .insert(dg.src_port);
            continue;
        }
        let deth = p.ext.deth.expect("a packet to QP1 is UD");
        assert_eq!((deth.qkey, deth.src_qp), (cm::GSI_QKEY, cm::GSI_QPN));
        assert_eq!(p.payload.len(), cm::MAD_LEN, "frame {}", rec.frame);
        let mad =
            CmMad::parse(p.payload).unwrap_or_else(|e| panic!("{name} frame {}: {e}", rec.frame));
        // Every field is kept: the MAD re-emits byte for byte.
        let mut out = [0u8; cm::MAD_LEN];
        assert_eq!(mad.emit(&mut out), Ok(cm::MAD_LEN));
        assert_eq!(hex(&out), hex(p.payload), "{name} frame {}", rec.frame);
        assert_eq!(
            (mad.header.base_version, mad.header.class_version),
            (cm::MAD_BASE_VERSION, cm::CM_CLASS_VERSION)
        );
        assert_eq!(mad.header.method, cm::METHOD_SEND);
        assert_eq!(
            (
                mad.header.status,
                mad.header.class_specific,
                mad.header.reserved,
                mad.header.attr_mod
            ),
            (0, 0, 0, 0)
        );
        c.mads.push(Mad {
            frame: rec.frame,
            src: dg.src,
            dst: dg.dst,
            mad,
        });
    }
    Some(c)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn counts(c: &Capture) -> BTreeMap<&'static str, usize> {
    let mut n = BTreeMap::new();
    for m in &c.mads {
        *n.entry(cm::attr_name(m.mad.header.attr_id)).or_default() += 1;
    }
    n
}

fn expect_counts(c: &Capture, want: &[(&'static str, usize)]) {
    let want: BTreeMap<_, _> = want.iter().copied().collect();
    assert_eq!(counts(c), want);
}

fn frame(c: &Capture, n: u64) -> &Mad {
    c.mads
        .iter()
        .find(|m| m.frame == n)
        .unwrap_or_else(|| panic!("no CM MAD in frame {n}"))
}

fn v4(a: Ipv4Addr) -> IpAddr {
    IpAddr::V4(a)
}

/// `rdma_flow_label_to_udp_sport` (include/rdma/ib_verbs.h).
fn flow_label_to_udp_sport(fl: u32) -> u16 {
    let fl_low = fl & 0x03FFF;
    let fl_high = fl & 0xFC000;
    ((fl_low ^ (fl_high >> 14)) as u16) | 0xC000
}

fn gid_v4(a: Ipv4Addr) -> [u8; 16] {
    a.to_ipv6_mapped().octets()
}

fn req(m: &Mad) -> &ReqRepr {
    assert_eq!(m.mad.header.attr_id, attr::REQ);
    match &m.mad.message {
        CmMessage::Req(r) => r,
        other => panic!("frame {}: not a REQ: {other:?}", m.frame),
    }
}

fn rep(m: &Mad) -> &RepRepr {
    assert_eq!(m.mad.header.attr_id, attr::REP);
    match &m.mad.message {
        CmMessage::Rep(r) => r,
        other => panic!("frame {}: not a REP: {other:?}", m.frame),
    }
}

fn dreq(m: &Mad) -> &DreqRepr {
    assert_eq!(m.mad.header.attr_id, attr::DREQ);
    match &m.mad.message {
        CmMessage::Dreq(r) => r,
        other => panic!("frame {}: not a DREQ: {other:?}", m.frame),
    }
}

fn rtu_ids(m: &Mad) -> (u32, u32) {
    assert_eq!(m.mad.header.attr_id, attr::RTU);
    match &m.mad.message {
        CmMessage::Rtu(r) => {
            assert!(r.private_data.iter().all(|&b| b == 0));
            (r.local_comm_id, r.remote_comm_id)
        }
        other => panic!("frame {}: not an RTU: {other:?}", m.frame),
    }
}

fn drep_ids(m: &Mad) -> (u32, u32) {
    assert_eq!(m.mad.header.attr_id, attr::DREP);
    match &m.mad.message {
        CmMessage::Drep(r) => (r.local_comm_id, r.remote_comm_id),
        other => panic!("frame {}: not a DREP: {other:?}", m.frame),
    }
}

/// What rdma_cm's REQs over rxe have in common (all three captures).
fn check_rxe_req(m: &Mad, r: &ReqRepr) {
    assert_eq!((m.src, m.dst), (v4(CLIENT), v4(SERVER)));
    assert_eq!((r.reserved_4, r.vendor_id, r.reserved_24), (0, 0, 0));
    assert_eq!(r.local_ca_guid, 0x5054_00ff_fe47_9102);
    assert_eq!(r.local_qkey, 0);
    assert_eq!((r.local_eecn, r.remote_eecn), (0, 0));
    assert_eq!(r.remote_cm_response_timeout, 0x14);
    assert_eq!(r.transport_service_type, 0);
    assert!(!r.end_to_end_flow_control);
    assert_eq!(r.local_cm_response_timeout, 0x14);
    assert_eq!(r.retry_count, 7);
    assert_eq!(r.pkey, 0xffff);
    assert_eq!(r.path_mtu, 3);
    assert!(!r.rdc_exists);
    assert_eq!(r.rnr_retry_count, 7);
    assert_eq!(r.max_cm_retries, 0xf);
    assert!(!r.srq);
    assert_eq!(r.extended_transport, 0);
    let p = &r.primary;
    assert_eq!((p.local_lid, p.remote_lid), (65535, 65535));
    assert_eq!(p.local_gid, gid_v4(CLIENT));
    assert_eq!(p.remote_gid, gid_v4(SERVER));
    assert_eq!((p.reserved_rate, p.packet_rate), (0, 0));
    assert_eq!((p.traffic_class, p.hop_limit), (0, 0x40));
    assert_eq!((p.sl, p.subnet_local, p.reserved_sl), (0, false, 0));
    assert_eq!((p.local_ack_timeout, p.reserved_ack), (0x13, 0));
    assert_eq!(r.alternate, PathRepr::default());
    let h = rdma_cm::CmaHeader::parse(&r.private_data).unwrap();
    assert_eq!((h.cma_version, h.ip_version), (0, 4));
    assert_eq!((h.src, h.dst), (v4(CLIENT), v4(SERVER)));
    // rdma_cm's consumer private data after the header is empty.
    assert!(r.private_data[rdma_cm::CMA_HEADER_LEN..]
        .iter()
        .all(|&b| b == 0));
}

/// What the REPs have in common.
fn check_rxe_rep(m: &Mad, r: &RepRepr) {
    assert_eq!((m.src, m.dst), (v4(SERVER), v4(CLIENT)));
    assert_eq!((r.local_qkey, r.local_eecn, r.vendor_id), (0, 0, 0));
    assert_eq!(r.target_ack_delay, 0x0f);
    assert_eq!(r.failover_accepted, 0);
    assert!(!r.end_to_end_flow_control);
    assert_eq!((r.rnr_retry_count, r.srq, r.reserved_27), (7, false, 0));
    assert_eq!(r.local_ca_guid, 0x5054_00ff_fe47_9101);
    assert!(r.private_data.iter().all(|&b| b == 0));
}

/// The REQ's flow label is the one the connection's data packets use,
/// and the kernel derives it from the rdma_cm ports.
fn check_flow_label(c: &Capture, r: &ReqRepr, p: &RepRepr) {
    let src_port = rdma_cm::CmaHeader::parse(&r.private_data).unwrap().port;
    let (_, dst_port) = rdma_cm::port_space_of(r.service_id).unwrap();
    assert_eq!(
        r.primary.flow_label,
        rdma_cm::roce_flow_label(src_port, dst_port)
    );
    let want = flow_label_to_udp_sport(r.primary.flow_label);
    for qpn in [r.local_qpn, p.local_qpn] {
        let ports = c.data_ports.get(&qpn).expect("data packets to the QP");
        assert_eq!(ports, &BTreeSet::from([want]), "QP {qpn:#x}");
    }
}

#[test]
fn rping() {
    let Some(c) = read("rdmacm_rping_s64.pcap") else {
        return;
    };
    expect_counts(
        &c,
        &[
            ("ConnectRequest", 1),
            ("ConnectReply", 1),
            ("ReadyToUse", 1),
            ("DisconnectRequest", 1),
            ("DisconnectReply", 1),
        ],
    );
    let tid = 0x0000_0002_d1db_ebe3;
    for m in &c.mads {
        assert_eq!(m.mad.header, MadHeaderRepr::cm(m.mad.header.attr_id, tid));
    }

    let m = frame(&c, 1);
    let r = req(m);
    check_rxe_req(m, r);
    assert_eq!(r.local_comm_id, 0xe3eb_dbd1);
    assert_eq!(r.service_id, 0x0000_0000_0106_1c06);
    assert_eq!(
        rdma_cm::port_space_of(r.service_id),
        Some((rdma_cm::PS_TCP, 7174))
    );
    assert_eq!(r.service_id, rdma_cm::service_id(rdma_cm::PS_TCP, 7174));
    assert_eq!(r.local_qpn, 0x00002b);
    assert_eq!((r.responder_resources, r.initiator_depth), (1, 1));
    assert_eq!(r.starting_psn, 0xb93b5a);
    assert_eq!(r.primary.flow_label, 0x95179);
    assert_eq!(
        rdma_cm::CmaHeader::parse(&r.private_data).unwrap().port,
        0xd02d
    );

    let m = frame(&c, 2);
    let p = rep(m);
    check_rxe_rep(m, p);
    assert_eq!(
        (p.local_comm_id, p.remote_comm_id),
        (0xd267_a808, 0xe3eb_dbd1)
    );
    assert_eq!(p.local_qpn, 0x00002b);
    assert_eq!(p.starting_psn, 0xd5acfb);
    assert_eq!((p.responder_resources, p.initiator_depth), (1, 1));
    check_flow_label(&c, r, p);

    assert_eq!(rtu_ids(frame(&c, 3)), (0xe3eb_dbd1, 0xd267_a808));

    let m = frame(&c, 64);
    let d = dreq(m);
    assert_eq!((m.src, m.dst), (v4(CLIENT), v4(SERVER)));
    assert_eq!(
        (d.local_comm_id, d.remote_comm_id),
        (0xe3eb_dbd1, 0xd267_a808)
    );
    assert_eq!((d.remote_qpn, d.reserved_11), (0x00002b, 0));

    let m = frame(&c, 65);
    assert_eq!((m.src, m.dst), (v4(SERVER), v4(CLIENT)));
    assert_eq!(drep_ids(m), (0xd267_a808, 0xe3eb_dbd1));
}

#[test]
fn rc_write_bw() {
    let Some(c) = read("rdmacm_rc_write_bw_s4096.pcap") else {
        return;
    };
    expect_counts(
        &c,
        &[
            ("ConnectRequest", 2),
            ("ConnectReply", 2),
            ("ReadyToUse", 2),
            ("DisconnectRequest", 2),
            ("DisconnectReply", 2),
        ],
    );
    let tids = [
        (1, 0x0000_0002_d1db_ebe1),
        (2, 0x0000_0002_d1db_ebe1),
        (3, 0x0000_0002_d1db_ebe1),
        (24, 0x0000_0002_d1db_ebe0),
        (25, 0x0000_0002_d1db_ebe0),
        (26, 0x0000_0002_d1db_ebe0),
        (96, 0x0000_0002_d1db_ebe0),
        (97, 0x0000_0002_d1db_ebe0),
        (98, 0x0000_0002_08a8_67d6),
        (99, 0x0000_0002_08a8_67d6),
    ];
    assert_eq!(c.mads.len(), tids.len());
    for (n, tid) in tids {
        assert_eq!(frame(&c, n).mad.header.tid, tid, "frame {n}");
    }

    // Two connections: (REQ frame, REP frame, comm IDs, QPN, PSNs, flow
    // label, CMA source port).
    let conns = [
        (
            1,
            2,
            0xe1eb_dbd1,
            0xd667_a808,
            0x29,
            0x37207e,
            0xf81ac0,
            0xac707,
            0xdacc,
        ),
        (
            24,
            25,
            0xe0eb_dbd1,
            0xd467_a808,
            0x2a,
            0x643f83,
            0x7f0b9e,
            0x14603,
            0x8c50,
        ),
    ];
    for (fq, fp, active, passive, qpn, psn, rep_psn, fl, port) in conns {
        let m = frame(&c, fq);
        let r = req(m);
        check_rxe_req(m, r);
        assert_eq!(r.local_comm_id, active);
        assert_eq!(r.service_id, 0x0000_0000_0106_4853);
        assert_eq!(
            rdma_cm::port_space_of(r.service_id),
            Some((rdma_cm::PS_TCP, 18515))
        );
        assert_eq!(r.local_qpn, qpn);
        assert_eq!((r.responder_resources, r.initiator_depth), (0, 0));
        assert_eq!(r.starting_psn, psn);
        assert_eq!(r.primary.flow_label, fl);
        assert_eq!(
            rdma_cm::CmaHeader::parse(&r.private_data).unwrap().port,
            port
        );

        let m = frame(&c, fp);
        let p = rep(m);
        check_rxe_rep(m, p);
        assert_eq!((p.local_comm_id, p.remote_comm_id), (passive, active));
        assert_eq!(p.local_qpn, qpn);
        assert_eq!(p.starting_psn, rep_psn);
        assert_eq!((p.responder_resources, p.initiator_depth), (0, 0));
        check_flow_label(&c, r, p);
    }
    assert_eq!(rtu_ids(frame(&c, 3)), (0xe1eb_dbd1, 0xd667_a808));
    assert_eq!(rtu_ids(frame(&c, 26)), (0xe0eb_dbd1, 0xd467_a808));

    // The client disconnects the second connection, the server the first.
    let m = frame(&c, 96);
    assert_eq!((m.src, m.dst), (v4(CLIENT), v4(SERVER)));
    let d = dreq(m);
    assert_eq!(
        (d.local_comm_id, d.remote_comm_id),
        (0xe0eb_dbd1, 0xd467_a808)
    );
    assert_eq!(d.remote_qpn, 0x2a);
    assert_eq!(drep_ids(frame(&c, 97)), (0xd467_a808, 0xe0eb_dbd1));
    let m = frame(&c, 98);
    assert_eq!((m.src, m.dst), (v4(SERVER), v4(CLIENT)));
    let d = dreq(m);
    assert_eq!(
        (d.local_comm_id, d.remote_comm_id),
        (0xd667_a808, 0xe1eb_dbd1)
    );
    assert_eq!(d.remote_qpn, 0x29);
    assert_eq!(drep_ids(frame(&c, 99)), (0xe1eb_dbd1, 0xd667_a808));
}

#[test]
fn udaddy_sidr() {
    let Some(c) = read("rdmacm_ud_udaddy_s64.pcap") else {
        return;
    };
    expect_counts(&c, &[("SIDR_REQ", 1), ("SIDR_REP", 1)]);
    let tid = 0x0000_0002_d1db_ebe2;

    let m = frame(&c, 1);
    assert_eq!(m.mad.header, MadHeaderRepr::cm(attr::SIDR_REQ, tid));
    assert_eq!((m.src, m.dst), (v4(CLIENT), v4(SERVER)));
    let CmMessage::SidrReq(q) = &m.mad.message else {
        panic!("not a SIDR_REQ: {:?}", m.mad.message)
    };
    assert_eq!(q.request_id, 0xe2eb_dbd1);
    assert_eq!((q.pkey, q.reserved_6), (0xffff, 0));
    assert_eq!(q.service_id, 0x0000_0000_0111_1c06);
    assert_eq!(
        rdma_cm::port_space_of(q.service_id),
        Some((rdma_cm::PS_UDP, 7174))
    );
    let h = rdma_cm::CmaHeader::parse(&q.private_data).unwrap();
    assert_eq!((h.cma_version, h.ip_version, h.port), (0, 4, 0x9c61));
    assert_eq!((h.src, h.dst), (v4(CLIENT), v4(SERVER)));

    let m = frame(&c, 2);
    assert_eq!(m.mad.header, MadHeaderRepr::cm(attr::SIDR_REP, tid));
    assert_eq!((m.src, m.dst), (v4(SERVER), v4(CLIENT)));
    let CmMessage::SidrRep(p) = &m.mad.message else {
        panic!("not a SIDR_REP: {:?}", m.mad.message)
    };
    assert_eq!(p.request_id, 0xe2eb_dbd1);
    assert_eq!((p.status, p.additional_info_length, p.vendor_id), (0, 0, 0));
    assert_eq!(p.qpn, 0x00002c);
    assert_eq!(p.service_id, 0x0000_0000_0111_1c06);
    assert_eq!(p.qkey, rdma_cm::UDP_QKEY);
    assert_eq!(p.qkey, 0x0123_4567);
    assert!(p.class_port_info.iter().all(|&b| b == 0));
    assert!(p.private_data.iter().all(|&b| b == 0));
    // The UD data then flows to the QP the SIDR_REP named.
    assert!(c.data_ports.contains_key(&p.qpn));
}
