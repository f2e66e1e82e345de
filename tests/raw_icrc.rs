//! `ROXE_ICRC=raw`: devices receiving from an `AF_PACKET` socket verify
//! every IPv4 ICRC over the real header, whatever identification the
//! sender wrote.
//!
//! These tests need `CAP_NET_RAW` (CI runs as root); without it each one
//! prints why it is skipped and passes. Every test has its own addresses
//! (`roxe_testnet`) and configures devices through `DeviceConfig` (not the
//! environment), so they run in parallel.

use roxe_verbs::*;
use roxe_wire::ext::DethRepr;
use roxe_wire::frame::{build_datagram, IpFields};
use roxe_wire::{BthRepr, ExtHeaders, Opcode, PacketRepr, Psn};
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
const QKEY: u32 = 0x1111_2222;

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn config(addr: Ipv4Addr, icrc: IcrcMode) -> DeviceConfig {
    DeviceConfig {
        addr: Some(IpAddr::V4(addr)),
        icrc,
        ..DeviceConfig::default()
    }
}

/// Open a device; `None` (after printing why) if this process lacks
/// `CAP_NET_RAW` for a raw device. Any other failure fails the test.
fn open(test: &str, name: &str, cfg: DeviceConfig) -> Option<Context> {
    match device_with(name, cfg).open() {
        Ok(c) => Some(c),
        Err(e) if cfg_is_raw_and_eperm(&e) => {
            eprintln!("{test}: skipped: no CAP_NET_RAW ({e})");
            None
        }
        Err(e) => panic!("{test}: opening {name}: {e}"),
    }
}

fn cfg_is_raw_and_eperm(e: &Error) -> bool {
    e.errno() == 1 && e.to_string().contains("CAP_NET_RAW")
}

/// Poll `f` until it holds or `T` passes.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn rc_traffic_between_raw_devices_arrives_intact() {
    const TEST: &str = "rc_traffic_between_raw_devices_arrives_intact";
    let Some(a) = open(
        TEST,
        "raw-rc-a",
        config(roxe_testnet::addr(), IcrcMode::Raw),
    ) else {
        return;
    };
    let b = open(
        TEST,
        "raw-rc-b",
        config(roxe_testnet::addr(), IcrcMode::Raw),
    )
    .unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (
        a.create_cq(64, None).unwrap(),
        b.create_cq(64, None).unwrap(),
    );
    let (ma, mb) = (
        pa.reg_mr(1 << 20, access()).unwrap(),
        pb.reg_mr(1 << 20, access()).unwrap(),
    );
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb)).unwrap();
    let (ea, eb) = (qa.endpoint(100), qb.endpoint(200));
    qa.connect(100, &eb, Mtu::Mtu1024, access(), 14).unwrap();
    qb.connect(200, &ea, Mtu::Mtu1024, access(), 14).unwrap();

    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + 3) as u8).collect();
    ma.write(0, &data).unwrap();
    // SEND (multi-packet), WRITE, READ back.
    qb.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![mb.sge(0, 100_000)],
    })
    .unwrap();
    qa.post_send(SendWr::new(10, SendOpcode::Send, vec![ma.sge(0, 100_000)]))
        .unwrap();
    let rx = cb.poll_wait(1, T).unwrap();
    assert_eq!(rx[0].status, WcStatus::Success);
    assert_eq!(rx[0].byte_len, 100_000);
    let mut w = SendWr::new(20, SendOpcode::RdmaWrite, vec![ma.sge(0, 100_000)]);
    w.remote_addr = mb.addr() + 200_000;
    w.rkey = mb.rkey();
    qa.post_send(w).unwrap();
    let mut r = SendWr::new(21, SendOpcode::RdmaRead, vec![ma.sge(400_000, 100_000)]);
    r.remote_addr = mb.addr() + 200_000;
    r.rkey = mb.rkey();
    qa.post_send(r).unwrap();
    let tx = ca.poll_wait(3, T).unwrap();
    assert!(tx.iter().all(|c| c.status == WcStatus::Success), "{tx:?}");
    let mut got = vec![0u8; 100_000];
    mb.read(0, &mut got).unwrap();
    assert!(got == data, "SEND data differs");
    mb.read(200_000, &mut got).unwrap();
    assert!(got == data, "WRITE data differs");
    ma.read(400_000, &mut got).unwrap();
    assert!(got == data, "READ data differs");

    for (name, ctx) in [("a", &a), ("b", &b)] {
        let s = ctx.stats().unwrap();
        assert_eq!(s.engine.rx_bad_icrc, 0, "{name}: {s:?}");
        assert_eq!(s.engine.rx_malformed, 0, "{name}: {s:?}");
        assert_eq!(s.driver.rx_raw_dropped, 0, "{name}: {s:?}");
        // The packets came through the raw socket, and the UDP socket's
        // copies were thrown away.
        assert!(s.driver.rx_datagrams > 0, "{name}: {s:?}");
        assert!(s.driver.rx_udp_discarded > 0, "{name}: {s:?}");
    }
}

/// A UD SEND-only packet as a whole IPv4 datagram from `src` (UDP port
/// 4791) with identification `ident` and the ICRC computed over that header.
fn ud_send(src: Ipv4Addr, dst: Ipv4Addr, ident: u16, dest_qp: u32, payload: &[u8]) -> Vec<u8> {
    let repr = PacketRepr {
        bth: BthRepr::new(Opcode::UdSendOnly, dest_qp, Psn::new(7)),
        ext: ExtHeaders {
            deth: Some(DethRepr {
                qkey: QKEY,
                src_qp: 0x77,
                reserved: 0,
            }),
            ..ExtHeaders::NONE
        },
        payload,
    };
    let mut buf = vec![0u8; 2048];
    let fields = IpFields {
        ipv4_ident: ident,
        ..IpFields::default()
    };
    let n = build_datagram(
        &mut buf,
        IpAddr::V4(src),
        IpAddr::V4(dst),
        4791,
        4791,
        fields,
        &repr,
    )
    .unwrap();
    buf.truncate(n);
    // What the ICRC covers, checked independently of the builder.
    assert!(roxe_wire::icrc::check_datagram(&buf).unwrap().ok());
    buf
}

/// Send a whole IPv4 datagram as it is (IPPROTO_RAW implies IP_HDRINCL;
/// Linux keeps a non-zero identification and fills in the checksum).
fn inject(sock: &std::os::fd::OwnedFd, datagram: &[u8]) {
    let dst = Ipv4Addr::new(datagram[16], datagram[17], datagram[18], datagram[19]);
    let n = rustix::net::sendto(
        sock,
        datagram,
        rustix::net::SendFlags::empty(),
        &SocketAddrV4::new(dst, 0),
    )
    .unwrap();
    assert_eq!(n, datagram.len());
}

/// A UD QP on `ctx` with `n` receives posted; returns (QP, CQ, MR).
fn ud_qp(ctx: &Context, n: u64) -> (Qp, Cq, Mr) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let mr = pd.reg_mr(16 * 4096, access()).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Ud, &cq, &cq)).unwrap();
    qp.ready_ud(QKEY, 0).unwrap();
    for k in 0..n {
        qp.post_recv(RecvWr {
            wr_id: k,
            sg_list: vec![mr.sge(k as usize * 4096, 4096)],
        })
        .unwrap();
    }
    (qp, cq, mr)
}

#[test]
fn raw_device_verifies_non_zero_identifications_and_strict_cannot() {
    const TEST: &str = "raw_device_verifies_non_zero_identifications_and_strict_cannot";
    let [raw_addr, strict_addr, injector] = roxe_testnet::addrs();
    let Some(r) = open(TEST, "raw-inject-r", config(raw_addr, IcrcMode::Raw)) else {
        return;
    };
    let s = open(TEST, "raw-inject-s", config(strict_addr, IcrcMode::Strict)).unwrap();
    let sock = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::RAW,
        Some(rustix::net::ipproto::RAW),
    )
    .unwrap();
    let (rq, rcq, rmr) = ud_qp(&r, 2);
    let (sq, scq, _smr) = ud_qp(&s, 2);
    let payload: Vec<u8> = (0..200u32).map(|i| (i * 13 + 1) as u8).collect();
    const IDENT: u16 = 0x5a17;

    // 1. Non-zero identification, correct ICRC over it: accepted.
    let good = ud_send(injector, raw_addr, IDENT, rq.qp_num(), &payload);
    inject(&sock, &good);
    let wc = rcq.poll_wait(1, T).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
    assert_eq!(wc[0].byte_len as usize, 40 + payload.len());
    assert_eq!(wc[0].src_qp, 0x77);
    let mut got = vec![0u8; payload.len()];
    rmr.read(40, &mut got).unwrap();
    assert_eq!(got, payload);
    assert_eq!(r.stats().unwrap().engine.rx_bad_icrc, 0);

    // 2. The same packet with one payload byte flipped, ICRC unchanged:
    // dropped and counted, although the kernel's UDP layer would take it
    // (UDP checksum 0) and the ICRC over identification 0 is no better.
    let mut bad = good.clone();
    let at = bad.len() - 4 - 100; // inside the payload, before the ICRC
    bad[at] ^= 0x40;
    assert!(!roxe_wire::icrc::check_datagram(&bad).unwrap().ok());
    inject(&sock, &bad);
    eventually("rx_bad_icrc on the raw device", || {
        r.stats().unwrap().engine.rx_bad_icrc == 1
    });
    // ... and the good one again, behind it: it arrives, the bad one did not.
    inject(&sock, &good);
    let wc = rcq.poll_wait(1, T).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
    assert_eq!(wc[0].wr_id, 1, "the second receive took the good packet");
    let st = r.stats().unwrap();
    assert_eq!(st.engine.rx_bad_icrc, 1, "{st:?}");
    assert_eq!(st.engine.rx_icrc_unverified, 0, "{st:?}");

    // 3. A strict (UDP socket) device cannot verify the identification it
    // never sees: the same correct packet is dropped as a bad ICRC.
    let good_s = ud_send(injector, strict_addr, IDENT, sq.qp_num(), &payload);
    inject(&sock, &good_s);
    eventually("rx_bad_icrc on the strict device", || {
        s.stats().unwrap().engine.rx_bad_icrc == 1
    });
    let mut wcs = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 4];
    assert_eq!(scq.poll(&mut wcs).unwrap(), 0, "strict device accepted it");
    // With identification 0 (what roxe and Linux send) it verifies there.
    inject(
        &sock,
        &ud_send(injector, strict_addr, 0, sq.qp_num(), &payload),
    );
    let wc = scq.poll_wait(1, T).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
}
