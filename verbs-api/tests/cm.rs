//! rdma_cm over roxe: two devices in one process (on loopback addresses of
//! their own, from `roxe_testnet`), connected through the CM protocol on
//! QP1 as two processes or two hosts would be.

use roxe_verbs::cm::*;
use roxe_verbs::*;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

/// The device address this file calls host `n`: leased (no other test
/// holds it), the same for every use of `n` in this process. Each test
/// uses host numbers of its own.
fn host(n: u8) -> Ipv4Addr {
    static HOSTS: Mutex<BTreeMap<u8, Ipv4Addr>> = Mutex::new(BTreeMap::new());
    *HOSTS
        .lock()
        .unwrap()
        .entry(n)
        .or_insert_with(roxe_testnet::addr)
}

fn addr(n: u8, port: u16) -> SocketAddr {
    SocketAddr::from((host(n), port))
}

fn next(ch: &EventChannel) -> Event {
    ch.get_event_timeout(WAIT)
        .expect("rdma_get_cm_event")
        .expect("an event within the wait")
}

fn expect(ch: &EventChannel, kind: EventKind) -> Event {
    let e = next(ch);
    assert_eq!(e.kind, kind, "{e:?}");
    e
}

struct Side {
    cq: Cq,
    mr: Mr,
}

fn qp_for(id: &CmId) -> (Qp, Side) {
    let ctx = id.context().expect("bound");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let mr = pd
        .reg_mr(
            1 << 16,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let qp = id
        .create_qp(Some(&pd), &QpInit::new(QpType::Rc, &cq, &cq))
        .unwrap();
    (qp, Side { cq, mr })
}

fn listener(host: u8, port: u16, ps: PortSpace) -> (EventChannel, CmId) {
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch, ps);
    id.bind_addr(addr(host, port)).unwrap();
    id.listen(64).unwrap();
    (ch, id)
}

fn resolved(src: u8, dst: SocketAddr, ps: PortSpace) -> (EventChannel, CmId) {
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch, ps);
    id.resolve_addr(Some(addr(src, 0)), dst).unwrap();
    expect(&ch, EventKind::AddrResolved);
    id.resolve_route().unwrap();
    expect(&ch, EventKind::RouteResolved);
    (ch, id)
}

#[test]
fn connect_send_disconnect_from_either_side() {
    for client_disconnects in [true, false] {
        let port = roxe_testnet::port();
        let (sch, _listen) = listener(1, port, PortSpace::Tcp);
        let (cch, cid) = resolved(2, addr(1, port), PortSpace::Tcp);
        let (cqp, cside) = qp_for(&cid);
        cid.connect(&ConnParam {
            private_data: b"hello from the client".to_vec(),
            ..ConnParam::default()
        })
        .unwrap();
        let req = expect(&sch, EventKind::ConnectRequest);
        assert_eq!(&req.param.private_data[..21], b"hello from the client");
        assert_eq!(req.param.qp_num, cqp.qp_num());
        assert!(req.listen_id.is_some());
        let sid = req.id.clone();
        assert_eq!(sid.peer_addr().map(|a| a.ip()), Some(addr(2, 0).ip()));
        let (sqp, sside) = qp_for(&sid);
        sqp.post_recv(RecvWr {
            wr_id: 5,
            sg_list: vec![sside.mr.sge(0, 4096)],
        })
        .unwrap();
        sid.accept(&ConnParam {
            private_data: b"welcome".to_vec(),
            ..ConnParam::default()
        })
        .unwrap();
        let est = expect(&cch, EventKind::Established);
        assert_eq!(&est.param.private_data[..7], b"welcome");
        assert_eq!(est.param.qp_num, sqp.qp_num());
        expect(&sch, EventKind::Established);
        // The QPs are connected: a SEND arrives.
        cside
            .mr
            .write(0, b"data over an rdma_cm connection")
            .unwrap();
        cqp.post_send(SendWr::new(1, SendOpcode::Send, vec![cside.mr.sge(0, 31)]))
            .unwrap();
        let wc = sside.cq.poll_wait(1, WAIT).unwrap();
        assert_eq!(
            (wc[0].wr_id, wc[0].status, wc[0].byte_len),
            (5, WcStatus::Success, 31)
        );
        let mut got = [0u8; 31];
        sside.mr.read(0, &mut got).unwrap();
        assert_eq!(&got, b"data over an rdma_cm connection");
        assert_eq!(
            cside.cq.poll_wait(1, WAIT).unwrap()[0].status,
            WcStatus::Success
        );
        // Disconnect from one side; the other hears it and answers.
        let (a, ach, b, bch) = if client_disconnects {
            (&cid, &cch, &sid, &sch)
        } else {
            (&sid, &sch, &cid, &cch)
        };
        a.disconnect().unwrap();
        expect(bch, EventKind::Disconnected);
        // Hearing the DREQ leaves the QP as it was (librdmacm moves it to
        // ERR only on REJECTED); the user's own disconnect moves it.
        let b_qp = if client_disconnects { &sqp } else { &cqp };
        assert_eq!(b_qp.query().unwrap().qp_state, QpState::Rts);
        b.disconnect().unwrap();
        expect(ach, EventKind::Disconnected);
        expect(ach, EventKind::TimewaitExit);
        expect(bch, EventKind::TimewaitExit);
        // The QPs went to ERR.
        assert_eq!(cqp.query().unwrap().qp_state, QpState::Err);
        assert_eq!(sqp.query().unwrap().qp_state, QpState::Err);
    }
}

#[test]
fn nobody_listening_is_rejected_at_once() {
    // A device at .3 that listens on nothing.
    let (listening, other) = (roxe_testnet::port(), roxe_testnet::port());
    let (_ch, _other) = listener(3, listening, PortSpace::Tcp);
    let (cch, cid) = resolved(4, addr(3, other), PortSpace::Tcp);
    let _ = qp_for(&cid);
    let t0 = Instant::now();
    cid.connect(&ConnParam::default()).unwrap();
    let e = expect(&cch, EventKind::Rejected);
    assert_eq!(e.status, 8, "IB_CM_REJ_INVALID_SERVICE_ID");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

#[test]
fn reject_with_private_data_and_limits() {
    let port = roxe_testnet::port();
    let (sch, _l) = listener(5, port, PortSpace::Tcp);
    let (cch, cid) = resolved(6, addr(5, port), PortSpace::Tcp);
    let (cqp, _side) = qp_for(&cid);
    let too_much = ConnParam {
        private_data: vec![1; MAX_CONNECT_PRIVATE_DATA + 1],
        ..ConnParam::default()
    };
    assert_eq!(cid.connect(&too_much).unwrap_err().errno(), 22);
    cid.connect(&ConnParam::default()).unwrap();
    let req = expect(&sch, EventKind::ConnectRequest);
    assert_eq!(
        req.id
            .reject(&[0; MAX_REJECT_PRIVATE_DATA + 1])
            .unwrap_err()
            .errno(),
        22
    );
    req.id.reject(b"not today").unwrap();
    let e = expect(&cch, EventKind::Rejected);
    assert_eq!(e.status, 28, "IB_CM_REJ_CONSUMER_DEFINED");
    assert_eq!(&e.param.private_data[..9], b"not today");
    // As librdmacm: a rejected connection's QP goes to ERR.
    assert_eq!(cqp.query().unwrap().qp_state, QpState::Err);
}

#[test]
fn a_dead_peer_is_unreachable_after_the_cm_retries() {
    // Nothing at .8: the REQs go unanswered.
    let (cch, cid) = resolved(7, addr(8, roxe_testnet::port()), PortSpace::Tcp);
    let _ = qp_for(&cid);
    // 4.096 µs × 2^12 ≈ 17 ms, 3 resends.
    cid.set_cm_timeouts(12, 3).unwrap();
    let t0 = Instant::now();
    cid.connect(&ConnParam::default()).unwrap();
    expect(&cch, EventKind::Unreachable);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(60) && took < Duration::from_secs(2),
        "{took:?}"
    );
}

#[test]
fn binding_an_address_of_no_interface_fails() {
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp);
    let e = id.bind_addr("192.0.2.1:1".parse().unwrap()).unwrap_err();
    assert_eq!(e.errno(), 99, "EADDRNOTAVAIL: {e}");
}

#[test]
fn one_listener_accepts_sixty_four_connections() {
    const N: usize = 64;
    let port = roxe_testnet::port();
    let (sch, _l) = listener(9, port, PortSpace::Tcp);
    let cch = EventChannel::new().unwrap();
    let mut clients = Vec::new();
    for _ in 0..N {
        let id = CmId::new(&cch, PortSpace::Tcp);
        id.resolve_addr(Some(addr(10, 0)), addr(9, port)).unwrap();
        clients.push(id);
    }
    for _ in 0..N {
        let e = expect(&cch, EventKind::AddrResolved);
        e.id.resolve_route().unwrap();
    }
    let mut keep = Vec::new();
    for _ in 0..N {
        let e = expect(&cch, EventKind::RouteResolved);
        keep.push(qp_for(&e.id));
        e.id.connect(&ConnParam::default()).unwrap();
    }
    let t0 = Instant::now();
    let (mut accepted, mut established_c, mut established_s) = (0, 0, 0);
    let mut server_ids = Vec::new();
    while established_c < N || established_s < N {
        assert!(
            t0.elapsed() < WAIT,
            "{accepted} {established_c} {established_s}"
        );
        if let Some(e) = sch.get_event_timeout(Duration::from_millis(1)).unwrap() {
            match e.kind {
                EventKind::ConnectRequest => {
                    keep.push(qp_for(&e.id));
                    e.id.accept(&ConnParam::default()).unwrap();
                    server_ids.push(e.id);
                    accepted += 1;
                }
                EventKind::Established => established_s += 1,
                k => panic!("server: {k:?}"),
            }
        }
        if let Some(e) = cch.get_event_timeout(Duration::from_millis(1)).unwrap() {
            assert_eq!(e.kind, EventKind::Established, "{e:?}");
            established_c += 1;
        }
    }
    assert_eq!(accepted, N);
}

#[test]
fn ud_ids_resolve_through_sidr() {
    let (port, unheard) = (roxe_testnet::port(), roxe_testnet::port());
    let (sch, _l) = listener(11, port, PortSpace::Udp);
    let (cch, cid) = resolved(12, addr(11, port), PortSpace::Udp);
    let cctx = cid.context().unwrap();
    let cpd = cctx.alloc_pd().unwrap();
    let ccq = cctx.create_cq(16, None).unwrap();
    let cqp = cid
        .create_qp(Some(&cpd), &QpInit::new(QpType::Ud, &ccq, &ccq))
        .unwrap();
    cid.connect(&ConnParam {
        private_data: b"ud?".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    let req = expect(&sch, EventKind::ConnectRequest);
    let ud = req.ud.clone().expect("UD parameters");
    assert_eq!(&ud.private_data[..3], b"ud?");
    let sctx = req.id.context().unwrap();
    let spd = sctx.alloc_pd().unwrap();
    let scq = sctx.create_cq(16, None).unwrap();
    let smr = spd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let sqp = req
        .id
        .create_qp(Some(&spd), &QpInit::new(QpType::Ud, &scq, &scq))
        .unwrap();
    sqp.post_recv(RecvWr {
        wr_id: 9,
        sg_list: vec![smr.sge(0, 40 + 100)],
    })
    .unwrap();
    req.id.accept(&ConnParam::default()).unwrap();
    let est = expect(&cch, EventKind::Established);
    let ud = est.ud.expect("UD parameters");
    assert_eq!((ud.qp_num, ud.qkey), (sqp.qp_num(), RDMA_UDP_QKEY));
    // A datagram to the resolved QP arrives.
    let ah = cpd.create_ah(&ud.ah_attr).unwrap();
    let cmr = cpd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    cmr.write(0, &[7u8; 100]).unwrap();
    let mut wr = SendWr::new(1, SendOpcode::Send, vec![cmr.sge(0, 100)]);
    wr.ud = Some(ah.dest(ud.qp_num, ud.qkey));
    cqp.post_send(wr).unwrap();
    let wc = scq.poll_wait(1, WAIT).unwrap();
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (9, WcStatus::Success, 140)
    );
    // Nobody listening on a UDP port: SIDR says unsupported.
    let (cch2, cid2) = resolved(12, addr(11, unheard), PortSpace::Udp);
    cid2.connect(&ConnParam::default()).unwrap();
    let e = expect(&cch2, EventKind::Rejected);
    assert_eq!(e.status, 1);
}

/// Ids dropped while their events are still on the way (the RTU, the
/// Established): the last reference may then be released anywhere, and an
/// id's drop frees its QP, which takes the device lock. This once
/// deadlocked the progress thread (it dropped the id inside its event
/// dispatch, under that lock). Bounded: the work runs in a thread.
#[test]
fn ids_dropped_with_events_in_flight_do_not_deadlock() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (sch, _l) = listener(13, 7300, PortSpace::Tcp);
        for round in 0..20 {
            let (_cch, cid) = resolved(14, addr(13, 7300), PortSpace::Tcp);
            let _keep = qp_for(&cid);
            cid.connect(&ConnParam::default()).unwrap();
            let req = expect(&sch, EventKind::ConnectRequest);
            let _skeep = qp_for(&req.id);
            req.id.accept(&ConnParam::default()).unwrap();
            // Drop both sides now, racing the REP/RTU and their events.
            drop(req);
            drop(cid);
            let _ = round;
        }
        tx.send(()).unwrap();
    });
    rx.recv_timeout(WAIT)
        .expect("connections torn down mid-handshake: a deadlock?");
}

/// IPv6: one device on ::1 (the only IPv6 loopback address) connects to
/// itself through the CM; the CMA header and GIDs carry IPv6 addresses.
/// It holds ::1 (`roxe_testnet::ipv6_loopback`) for the rest of the
/// process: the device stays open.
#[test]
fn ipv6_connects_to_itself_over_the_cm() {
    let ipv6 = roxe_testnet::ipv6_loopback("ipv6_connects_to_itself_over_the_cm");
    let (port, v6) = (roxe_testnet::port(), |port| SocketAddr::from((ipv6, port)));
    let sch = EventChannel::new().unwrap();
    let listen = CmId::new(&sch, PortSpace::Tcp);
    listen.bind_addr(v6(port)).unwrap();
    listen.listen(4).unwrap();
    let cch = EventChannel::new().unwrap();
    let cid = CmId::new(&cch, PortSpace::Tcp);
    cid.resolve_addr(Some(v6(0)), v6(port)).unwrap();
    expect(&cch, EventKind::AddrResolved);
    cid.resolve_route().unwrap();
    expect(&cch, EventKind::RouteResolved);
    let (cqp, cside) = qp_for(&cid);
    cid.connect(&ConnParam::default()).unwrap();
    let req = expect(&sch, EventKind::ConnectRequest);
    assert_eq!(req.id.peer_addr().map(|a| a.ip()), Some(ipv6.into()));
    assert_eq!(
        req.id.peer_addr().map(|a| a.port()),
        cid.local_addr().map(|a| a.port())
    );
    let (sqp, sside) = qp_for(&req.id);
    sqp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![sside.mr.sge(0, 64)],
    })
    .unwrap();
    req.id.accept(&ConnParam::default()).unwrap();
    expect(&cch, EventKind::Established);
    expect(&sch, EventKind::Established);
    cside.mr.write(0, b"over IPv6").unwrap();
    cqp.post_send(SendWr::new(2, SendOpcode::Send, vec![cside.mr.sge(0, 9)]))
        .unwrap();
    let wc = sside.cq.poll_wait(1, WAIT).unwrap();
    assert_eq!((wc[0].status, wc[0].byte_len), (WcStatus::Success, 9));
    let mut got = [0u8; 9];
    sside.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"over IPv6");
}

/// A listener destroyed and another listening on its port at once (the
/// server of perftest -R does this between its control and test
/// connections): the port is free again when `listen` is called, and the
/// new listener takes connections.
#[test]
fn a_port_is_free_again_right_after_its_listener_is_dropped() {
    let port = roxe_testnet::port();
    for round in 0..20 {
        let (ch, l) = listener(40, port, PortSpace::Tcp);
        drop(l);
        drop(ch);
        let (lch, l2) = listener(40, port, PortSpace::Tcp);
        if round == 19 {
            let (cch, c) = resolved(41, addr(40, port), PortSpace::Tcp);
            let (_qp, _side) = qp_for(&c);
            c.connect(&ConnParam::default()).unwrap();
            let req = expect(&lch, EventKind::ConnectRequest);
            assert_eq!(req.listen_id.as_ref(), Some(&l2));
            req.id.reject(&[]).unwrap();
            expect(&cch, EventKind::Rejected);
        }
    }
}

/// `getaddrinfo` gives what `bind_addr` (passive) and `resolve_addr`
/// (active) take, and a connection made from its answers works.
#[test]
fn getaddrinfo_answers_connect() {
    let (server, port) = (host(42).to_string(), roxe_testnet::port());
    let service = port.to_string();
    let passive = getaddrinfo(Some(&server), &service, true, PortSpace::Tcp, None).unwrap();
    assert_eq!(passive.len(), 1);
    assert_eq!(passive[0].src, Some(addr(42, port)));
    assert_eq!(passive[0].qp_type, QpType::Rc);
    let wildcard = getaddrinfo(None, &service, true, PortSpace::Udp, None).unwrap();
    assert_eq!(
        wildcard[0].src,
        Some(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
    );
    assert_eq!(wildcard[0].qp_type, QpType::Ud);
    let src = Some(addr(43, 0));
    let active = getaddrinfo(Some(&server), &service, false, PortSpace::Tcp, src).unwrap();
    assert_eq!((active[0].src, active[0].dst), (src, Some(addr(42, port))));
    assert!(getaddrinfo(Some(&server), "http", false, PortSpace::Tcp, None).is_err());
    assert!(getaddrinfo(
        Some("no-such-host.invalid"),
        "1",
        false,
        PortSpace::Tcp,
        None
    )
    .is_err());

    let lch = EventChannel::new().unwrap();
    let l = CmId::new(&lch, PortSpace::Tcp);
    l.bind_addr(passive[0].src.unwrap()).unwrap();
    l.listen(1).unwrap();
    let cch = EventChannel::new().unwrap();
    let c = CmId::new(&cch, PortSpace::Tcp);
    c.resolve_addr(active[0].src, active[0].dst.unwrap())
        .unwrap();
    expect(&cch, EventKind::AddrResolved);
    c.resolve_route().unwrap();
    expect(&cch, EventKind::RouteResolved);
    let (_qp, _side) = qp_for(&c);
    c.connect(&ConnParam::default()).unwrap();
    let req = expect(&lch, EventKind::ConnectRequest);
    let (_sqp, _sside) = qp_for(&req.id);
    req.id.accept(&ConnParam::default()).unwrap();
    expect(&cch, EventKind::Established);
    expect(&lch, EventKind::Established);
}

/// A burst of events larger than the channel's socket buffer holds (2,000
/// ADDR_RESOLVED at once: 256 lost wake-ups before) is delivered in full,
/// and the fd is readable exactly while events wait.
#[test]
fn a_burst_of_events_is_never_stranded() {
    use std::os::fd::AsFd;
    let readable = |ch: &EventChannel| {
        let mut fds = [rustix::event::PollFd::new(ch, rustix::event::PollFlags::IN)];
        rustix::event::poll(&mut fds, Some(&rustix::time::Timespec::default())).unwrap() == 1
    };
    let ch = EventChannel::new().unwrap();
    let _ = ch.as_fd();
    let ids: Vec<CmId> = (0..2000)
        .map(|_| {
            let id = CmId::new(&ch, PortSpace::Tcp);
            id.resolve_addr(Some(addr(44, 0)), addr(45, 1)).unwrap();
            id
        })
        .collect();
    assert!(readable(&ch));
    let mut n = 0;
    while let Some(e) = ch.try_get_event().unwrap() {
        assert_eq!(e.kind, EventKind::AddrResolved);
        n += 1;
        if n == 1000 {
            // Half way: a blocking wait still finds the rest.
            assert_eq!(ch.get_event().unwrap().kind, EventKind::AddrResolved);
            n += 1;
        }
    }
    assert_eq!(n, ids.len());
    assert!(
        !readable(&ch),
        "no events left, the fd must not be readable"
    );
}
