//! rdma_cm under hostile traffic on real sockets. While a real connection
//! (and a SIDR resolution) is set up between two devices, forged CM MADs
//! arrive on QP1 of both: random bytes, truncated MADs, plausible REQs and
//! SIDR_REQs to the listener's service ID that are wrong in everything
//! else, DREQ/REJ/DREP/REP/RTU/MRA with guessed comm IDs, some from other
//! loopback addresses and some spoofing the peer's address. Every forged
//! packet is a valid RoCEv2 UD packet to QP1 (ICRC and Q_Key right), so
//! each reaches the CM. The real connection completes and carries its data
//! intact, the listener sees only the real request, and the CM's counters
//! account for every forged MAD. Seeded (`ROXE_TEST_SEED` replays a run).

use roxe_verbs::cm::*;
use roxe_verbs::*;
use roxe_wire::cm::{self as wcm, attr, rdma_cm, CmMad, CmMessage, MadHeaderRepr};
use roxe_wire::{BthRepr, DethRepr, ExtHeaders, Opcode, PacketRepr};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

fn seed() -> u64 {
    let s = std::env::var("ROXE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x6e57_11e5);
    println!("seed {s} (ROXE_TEST_SEED={s} replays it)");
    s
}

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn fill(&mut self, b: &mut [u8]) {
        for x in b {
            *x = self.next() as u8;
        }
    }
}

/// A socket that sends RoCEv2 UD packets to QP1 from the address it is
/// bound to.
struct Sender {
    sock: UdpSocket,
    src: Ipv4Addr,
}

impl Sender {
    fn bound(src: Ipv4Addr, port: u16) -> Sender {
        let sock = UdpSocket::bind((src, port)).expect("bind a forging socket");
        sock.set_nonblocking(true).unwrap();
        Sender { sock, src }
    }

    /// How many datagrams (the CM's answers) wait on the socket; reads
    /// them.
    fn drain(&self) -> u64 {
        let mut buf = [0u8; 2048];
        let mut n = 0;
        while self.sock.recv(&mut buf).is_ok() {
            n += 1;
        }
        n
    }

    /// `mad` (any length) in a UD SEND_ONLY from QP1 to QP1 of `dst`.
    fn send(&self, dst: Ipv4Addr, mad: &[u8], psn: u32) {
        let repr = PacketRepr {
            bth: BthRepr {
                ack_req: true,
                ..BthRepr::new(Opcode::UdSendOnly, wcm::GSI_QPN, roxe_wire::Psn::new(psn))
            },
            ext: ExtHeaders {
                deth: Some(DethRepr {
                    qkey: wcm::GSI_QKEY,
                    src_qp: wcm::GSI_QPN,
                    reserved: 0,
                }),
                ..ExtHeaders::NONE
            },
            payload: mad,
        };
        let port = self.sock.local_addr().unwrap().port();
        let mut buf = [0u8; 512];
        let n = repr
            .emit_ipv4_linux(&mut buf, self.src, dst, port, 4791)
            .expect("emit");
        self.sock.send_to(&buf[..n], (dst, 4791)).expect("send");
    }
}

/// One forged MAD. `slot`: the server process's slot on its address,
/// which half of the guessed comm IDs name (on a shared address the
/// others are steered away before the CM, as another process's).
fn forged(rng: &mut Rng, service_id: u64, sidr_service_id: u64, slot: u8) -> Vec<u8> {
    let mut mad = vec![0u8; wcm::MAD_LEN];
    rng.fill(&mut mad);
    let cm_header = |attr_id: u16, tid: u64| MadHeaderRepr::cm(attr_id, tid);
    match rng.below(6) {
        // Random bytes, header and all.
        0 => mad,
        // A CM MAD cut short.
        1 => {
            cm_header(attr::REQ, rng.next()).emit(&mut mad).unwrap();
            mad.truncate(1 + rng.below(wcm::MAD_LEN as u64 - 1) as usize);
            mad
        }
        // A REQ to the listener, wrong in everything else.
        2 => {
            let mut data = [0u8; wcm::CM_DATA_LEN];
            rng.fill(&mut data);
            let mut req = wcm::ReqRepr::parse(&data);
            req.service_id = service_id;
            let m = CmMad {
                header: cm_header(attr::REQ, rng.next()),
                message: CmMessage::Req(req),
            };
            m.emit(&mut mad).unwrap();
            mad
        }
        // A SIDR_REQ to the UD listener, wrong in everything else.
        3 => {
            let mut data = [0u8; wcm::CM_DATA_LEN];
            rng.fill(&mut data);
            let mut req = wcm::SidrReqRepr::parse(&data);
            req.service_id = sidr_service_id;
            CmMad {
                header: cm_header(attr::SIDR_REQ, rng.next()),
                message: CmMessage::SidrReq(req),
            }
            .emit(&mut mad)
            .unwrap();
            mad
        }
        // A message of a connection, with guessed comm IDs.
        _ => {
            let attrs = [
                attr::DREQ,
                attr::DREP,
                attr::REJ,
                attr::REP,
                attr::RTU,
                attr::MRA,
            ];
            let a = attrs[rng.below(attrs.len() as u64) as usize];
            cm_header(a, rng.next()).emit(&mut mad).unwrap();
            if rng.below(2) == 0 {
                // The remote comm ID's top byte: the slot it belongs to.
                mad[REMOTE_COMM_ID_AT] = slot;
            }
            mad
        }
    }
}

/// A device's CM counters.
fn cm_stats(ctx: &Context) -> roxe_provider::cm::CmStats {
    ctx.soft_device()
        .expect("a soft device")
        .engine()
        .cm_stats()
}

/// Packets the device dropped before its CM as another process's (on a
/// shared address, a MAD whose comm ID names another process's slot).
fn steered_away(ctx: &Context) -> u64 {
    ctx.soft_device()
        .expect("a soft device")
        .misrouted_dropped()
}

/// Where a CM message's remote comm ID starts in its MAD.
const REMOTE_COMM_ID_AT: usize = 28;

/// The device's process slot on its address: a QPN's bits 16..23, and
/// the top byte of every comm ID it chooses.
fn slot_of(ctx: &Context) -> u8 {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Ud, &cq, &cq)).unwrap();
    (qp.qp_num() >> 16) as u8
}

/// Forged MADs the CM has accounted for.
fn accounted(s: &roxe_provider::cm::CmStats) -> u64 {
    s.rx_malformed + s.rx_unmatched + s.refused.total() + s.rejected_no_listener
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

/// What a flood sent, and the answers its attackers got back.
#[derive(Debug)]
struct Sent {
    to_server: u64,
    to_client: u64,
    answers_to_attackers: u64,
}

struct Flood {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Sent>,
}

/// Send forged MADs to `server` and `client` until stopped: from
/// `attackers` (port 4791, where the CM's answers to them arrive and are
/// counted), and from `client_addr` (spoofing the client towards the
/// server) and `server_addr` (spoofing the server towards the client:
/// answers to those go to the real devices).
fn flood(
    seed: u64,
    attackers: Vec<Ipv4Addr>,
    server_addr: Ipv4Addr,
    client_addr: Ipv4Addr,
    service_id: u64,
    sidr_service_id: u64,
    server_slot: u8,
) -> Flood {
    let stop = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        let mut rng = Rng(seed);
        let attackers: Vec<Sender> = attackers.iter().map(|a| Sender::bound(*a, 4791)).collect();
        let spoof_client = Sender::bound(client_addr, 0);
        let spoof_server = Sender::bound(server_addr, 0);
        let (mut to_server, mut to_client, mut answers) = (0u64, 0u64, 0u64);
        let mut psn = 0u32;
        while !s.load(Ordering::Relaxed) && to_server < 20_000 {
            // Paced: a burst, then a pause, so no socket buffer overflows
            // and every packet is accounted for.
            for _ in 0..16 {
                let mad = forged(&mut rng, service_id, sidr_service_id, server_slot);
                psn = psn.wrapping_add(1) & 0xFF_FFFF;
                match rng.below(4) {
                    0 => {
                        spoof_client.send(server_addr, &mad, psn);
                        to_server += 1;
                    }
                    1 => {
                        spoof_server.send(client_addr, &mad, psn);
                        to_client += 1;
                    }
                    _ => {
                        let k = rng.below(attackers.len() as u64) as usize;
                        attackers[k].send(server_addr, &mad, psn);
                        to_server += 1;
                    }
                }
            }
            std::thread::sleep(Duration::from_micros(500));
            answers += attackers.iter().map(Sender::drain).sum::<u64>();
        }
        // The last answers.
        let end = Instant::now() + Duration::from_millis(300);
        while Instant::now() < end {
            answers += attackers.iter().map(Sender::drain).sum::<u64>();
            std::thread::sleep(Duration::from_millis(5));
        }
        Sent {
            to_server,
            to_client,
            answers_to_attackers: answers,
        }
    });
    Flood { stop, thread }
}

impl Flood {
    fn end(self) -> Sent {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the flood thread")
    }
}

#[test]
fn a_real_connection_completes_under_forged_cm_mads() {
    let seed = seed();
    let [server_addr, client_addr, a1, a2, a3] = roxe_testnet::addrs();
    let (port, udp_port) = (roxe_testnet::port(), roxe_testnet::port());
    println!("server {server_addr}, client {client_addr}, attackers {a1} {a2} {a3}, port {port}");
    let sch = EventChannel::new().unwrap();
    let listen = CmId::new(&sch, PortSpace::Tcp);
    listen
        .bind_addr(SocketAddr::from((server_addr, port)))
        .unwrap();
    listen.listen(16).unwrap();
    let sctx = listen.context().unwrap();
    // A UD listener too, for the forged SIDR_REQs (and a real one).
    let uch = EventChannel::new().unwrap();
    let ulisten = CmId::new(&uch, PortSpace::Udp);
    ulisten
        .bind_addr(SocketAddr::from((server_addr, udp_port)))
        .unwrap();
    ulisten.listen(16).unwrap();
    let cch = EventChannel::new().unwrap();
    let cid = CmId::new(&cch, PortSpace::Tcp);
    cid.resolve_addr(
        Some(SocketAddr::from((client_addr, 0))),
        SocketAddr::from((server_addr, port)),
    )
    .unwrap();
    expect(&cch, EventKind::AddrResolved);
    cid.resolve_route().unwrap();
    expect(&cch, EventKind::RouteResolved);
    let cctx = cid.context().unwrap();
    let (s0, c0) = (cm_stats(&sctx), cm_stats(&cctx));
    let (s_away0, c_away0) = (steered_away(&sctx), steered_away(&cctx));

    let flood = flood(
        seed,
        vec![a1, a2, a3],
        server_addr,
        client_addr,
        rdma_cm::service_id(rdma_cm::PS_TCP, port),
        rdma_cm::service_id(rdma_cm::PS_UDP, udp_port),
        slot_of(&sctx),
    );
    // Let the flood run a while before and during the handshake.
    std::thread::sleep(Duration::from_millis(200));

    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let cpd = cctx.alloc_pd().unwrap();
    let ccq = cctx.create_cq(16, None).unwrap();
    let cmr = cpd.reg_mr(1 << 16, access).unwrap();
    let cqp = cid
        .create_qp(Some(&cpd), &QpInit::new(QpType::Rc, &ccq, &ccq))
        .unwrap();
    cid.connect(&ConnParam {
        private_data: b"the real client".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    let req = expect(&sch, EventKind::ConnectRequest);
    assert_eq!(&req.param.private_data[..15], b"the real client");
    assert_eq!(
        req.id.peer_addr().map(|a| a.ip()),
        Some(IpAddr::V4(client_addr))
    );
    let spd = sctx.alloc_pd().unwrap();
    let scq = sctx.create_cq(16, None).unwrap();
    let smr = spd.reg_mr(1 << 16, access).unwrap();
    let sqp = req
        .id
        .create_qp(Some(&spd), &QpInit::new(QpType::Rc, &scq, &scq))
        .unwrap();
    sqp.post_recv(RecvWr {
        wr_id: 7,
        sg_list: vec![smr.sge(0, 1 << 16)],
    })
    .unwrap();
    req.id.accept(&ConnParam::default()).unwrap();
    expect(&cch, EventKind::Established);
    expect(&sch, EventKind::Established);
    let data: Vec<u8> = (0..60_000u32).map(|i| (i * 7 + 3) as u8).collect();
    cmr.write(0, &data).unwrap();
    cqp.post_send(SendWr::new(
        1,
        SendOpcode::Send,
        vec![cmr.sge(0, data.len() as u32)],
    ))
    .unwrap();
    let wc = scq.poll_wait(1, WAIT).unwrap();
    assert_eq!(
        (wc[0].status, wc[0].byte_len),
        (WcStatus::Success, data.len() as u32)
    );
    let mut got = vec![0u8; data.len()];
    smr.read(0, &mut got).unwrap();
    assert!(got == data, "the SEND arrived damaged");

    // A real SIDR resolution while the flood goes on.
    let uid = CmId::new(&cch, PortSpace::Udp);
    uid.resolve_addr(
        Some(SocketAddr::from((client_addr, 0))),
        SocketAddr::from((server_addr, udp_port)),
    )
    .unwrap();
    expect(&cch, EventKind::AddrResolved);
    uid.resolve_route().unwrap();
    expect(&cch, EventKind::RouteResolved);
    let ucq = cctx.create_cq(4, None).unwrap();
    let _uqp = uid
        .create_qp(Some(&cpd), &QpInit::new(QpType::Ud, &ucq, &ucq))
        .unwrap();
    uid.connect(&ConnParam::default()).unwrap();
    let ureq = expect(&uch, EventKind::ConnectRequest);
    assert!(ureq.ud.is_some());
    let ucq_s = sctx.create_cq(4, None).unwrap();
    let _uqp_s = ureq
        .id
        .create_qp(Some(&spd), &QpInit::new(QpType::Ud, &ucq_s, &ucq_s))
        .unwrap();
    ureq.id.accept(&ConnParam::default()).unwrap();
    assert!(expect(&cch, EventKind::Established).ud.is_some());

    let sent = flood.end();
    println!("forged: {sent:?}");
    assert!(
        sent.to_server > 300 && sent.to_client > 100,
        "the flood barely ran"
    );
    // Each device also gets the other's answers to the MADs forged in its
    // name (the kernel's CM answers the same way): the client's answers
    // are every MAD it sent but the REQ, RTU and SIDR_REQ; the server's
    // to the client are all it sent but the REP, the SIDR_REP and those
    // the attackers received.
    let settle = |ctx: &Context, before: &roxe_provider::cm::CmStats, away0: u64| {
        let end = Instant::now() + WAIT;
        let mut last = cm_stats(ctx);
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = cm_stats(ctx);
            if now == last || Instant::now() >= end {
                let away = steered_away(ctx) - away0;
                return (now, accounted(&now) - accounted(before) + away);
            }
            last = now;
        }
    };
    let (s, s_accounted) = settle(&sctx, &s0, s_away0);
    let (c, c_accounted) = settle(&cctx, &c0, c_away0);
    println!("server CM: {s:?}\nclient CM: {c:?}");
    assert_eq!((s.tx_retries, c.tx_retries), (s0.tx_retries, c0.tx_retries));
    let client_answers = c.tx_mads - c0.tx_mads - 3;
    let server_answers_to_client = s.tx_mads - s0.tx_mads - 2 - sent.answers_to_attackers;
    assert_eq!(
        s_accounted,
        sent.to_server + client_answers,
        "server: {s:?}"
    );
    assert_eq!(
        c_accounted,
        sent.to_client + server_answers_to_client,
        "client: {c:?}"
    );
    assert!(s.refused.total() > 0 && s.rx_malformed > 0 && s.rx_unmatched > 0);
    // The listeners saw only the real requests; the connection still
    // carries data.
    for ch in [&sch, &uch] {
        let e = ch.get_event_timeout(Duration::from_millis(100)).unwrap();
        assert!(e.is_none(), "a listener saw more: {e:?}");
    }
    sqp.post_recv(RecvWr {
        wr_id: 8,
        sg_list: vec![smr.sge(0, 64)],
    })
    .unwrap();
    cqp.post_send(SendWr::new(2, SendOpcode::Send, vec![cmr.sge(0, 64)]))
        .unwrap();
    assert_eq!(scq.poll_wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
    cid.disconnect().unwrap();
    expect(&sch, EventKind::Disconnected);
}

/// A REQ as the kernel's rdma_cm sends it from `from` to `server:port`,
/// except that it asks for quick REP resends (16 ms, twice): well formed
/// in every field, so it passes every check and reaches the listener.
fn well_formed_req(rng: &mut Rng, from: Ipv4Addr, server: Ipv4Addr, port: u16) -> Vec<u8> {
    use roxe_provider::cm::{rocev2_req, ConnParams, RocePath};
    let gid = |a: Ipv4Addr| a.to_ipv6_mapped().octets();
    let mut private_data = vec![0u8; rdma_cm::CMA_HEADER_LEN];
    rdma_cm::CmaHeader {
        cma_version: 0,
        ip_version: 4,
        port: 1024 + rng.below(60_000) as u16, // testnet: allow (a CMA header field, no socket)
        src: IpAddr::V4(from),
        dst: IpAddr::V4(server),
    }
    .emit(&mut private_data)
    .unwrap();
    let path = RocePath {
        local_gid: gid(from),
        remote_gid: gid(server),
        path_mtu: 5,
        local_ack_timeout: 14,
        flow_label: 0,
        traffic_class: 0,
        packet_rate: 0,
    };
    let params = ConnParams {
        qpn: 0x11 + rng.below(1 << 20) as u32,
        psn: rng.below(1 << 24) as u32,
        private_data,
        ..ConnParams::default()
    };
    let mut req = rocev2_req(rdma_cm::service_id(rdma_cm::PS_TCP, port), &path, &params).unwrap();
    req.local_comm_id = rng.next() as u32 | 1;
    req.local_cm_response_timeout = 12;
    req.max_cm_retries = 2;
    let mut mad = vec![0u8; wcm::MAD_LEN];
    CmMad {
        header: MadHeaderRepr::cm(attr::REQ, rng.next()),
        message: CmMessage::Req(req),
    }
    .emit(&mut mad)
    .unwrap();
    mad
}

/// Well-formed REQs from addresses that never answer flood a listener
/// (as a SYN flood does a TCP server) while a real client connects: the
/// server accepts whatever comes, as it cannot tell; the real connection
/// is established and carries data, and every forged one ends when its
/// REP goes unanswered (the REP's resends are the bound), leaving nothing.
#[test]
fn a_flood_of_well_formed_reqs_does_not_keep_a_real_client_out() {
    let mut rng = Rng(seed());
    let [server_addr, client_addr, a1, a2] = roxe_testnet::addrs();
    let port = roxe_testnet::port();
    println!("server {server_addr}, client {client_addr}, attackers {a1} {a2}, port {port}");
    let sch = EventChannel::new().unwrap();
    let listen = CmId::new(&sch, PortSpace::Tcp);
    listen
        .bind_addr(SocketAddr::from((server_addr, port)))
        .unwrap();
    listen.listen(16).unwrap();
    let sctx = listen.context().unwrap();
    let spd = sctx.alloc_pd().unwrap();
    let scq = sctx.create_cq(1024, None).unwrap();
    let smr = spd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let flood_stop = Arc::clone(&stop);
    let mut flood_rng = Rng(rng.next());
    let flooder = std::thread::spawn(move || {
        let attackers = [Sender::bound(a1, 4791), Sender::bound(a2, 4791)];
        let mut sent = 0u64;
        let mut psn = 0;
        while !flood_stop.load(Ordering::Relaxed) && sent < 2000 {
            for _ in 0..8 {
                let k = flood_rng.below(2) as usize;
                let mad = well_formed_req(&mut flood_rng, attackers[k].src, server_addr, port);
                psn += 1;
                attackers[k].send(server_addr, &mad, psn);
                sent += 1;
            }
            std::thread::sleep(Duration::from_millis(2));
            for a in &attackers {
                a.drain();
            }
        }
        sent
    });
    std::thread::sleep(Duration::from_millis(50));

    // The real client, from another thread (a process of its own would
    // do the same).
    let client = std::thread::spawn(move || {
        let cch = EventChannel::new().unwrap();
        let cid = CmId::new(&cch, PortSpace::Tcp);
        cid.resolve_addr(
            Some(SocketAddr::from((client_addr, 0))),
            SocketAddr::from((server_addr, port)),
        )
        .unwrap();
        expect(&cch, EventKind::AddrResolved);
        cid.resolve_route().unwrap();
        expect(&cch, EventKind::RouteResolved);
        let ctx = cid.context().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(4, None).unwrap();
        let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let qp = cid
            .create_qp(Some(&pd), &QpInit::new(QpType::Rc, &cq, &cq))
            .unwrap();
        let t0 = Instant::now();
        cid.connect(&ConnParam::default()).unwrap();
        let e = next(&cch);
        assert_eq!(e.kind, EventKind::Established, "the real client: {e:?}");
        let took = t0.elapsed();
        mr.write(0, b"through the flood").unwrap();
        qp.post_send(SendWr::new(1, SendOpcode::Send, vec![mr.sge(0, 17)]))
            .unwrap();
        assert_eq!(cq.poll_wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
        (took, cid, qp, cch)
    });

    // The server: accept whatever comes; forget a request whose REP went
    // unanswered.
    let end = Instant::now() + 3 * WAIT;
    let (mut real, mut fakes_accepted, mut fakes_ended) = (None, 0u64, 0u64);
    let mut fakes: Vec<(CmId, Qp)> = Vec::new();
    let mut got_data = false;
    loop {
        assert!(Instant::now() < end, "the server gave up waiting");
        if let Some(e) = sch.get_event_timeout(Duration::from_millis(10)).unwrap() {
            match e.kind {
                EventKind::ConnectRequest => {
                    let qp =
                        e.id.create_qp(Some(&spd), &QpInit::new(QpType::Rc, &scq, &scq))
                            .unwrap();
                    let from_client =
                        e.id.peer_addr().map(|a| a.ip()) == Some(IpAddr::V4(client_addr));
                    if from_client {
                        qp.post_recv(RecvWr {
                            wr_id: 1,
                            sg_list: vec![smr.sge(0, 64)],
                        })
                        .unwrap();
                        real = Some((e.id.clone(), qp));
                    } else {
                        fakes_accepted += 1;
                        fakes.push((e.id.clone(), qp));
                    }
                    e.id.accept(&ConnParam::default()).unwrap();
                }
                EventKind::Unreachable => {
                    let k = fakes.iter().position(|f| f.0 == e.id);
                    let k = k.unwrap_or_else(|| panic!("the real one timed out: {e:?}"));
                    fakes.swap_remove(k);
                    fakes_ended += 1;
                }
                EventKind::Established => {
                    assert!(
                        real.as_ref().is_some_and(|r| r.0 == e.id),
                        "a fake was established"
                    );
                }
                k => panic!("server: {k:?}"),
            }
        }
        if !got_data {
            let mut wc = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 1];
            if scq.poll(&mut wc).unwrap() == 1 {
                assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
                got_data = true;
                stop.store(true, Ordering::Relaxed);
            }
        }
        if got_data && client.is_finished() && fakes_accepted > 0 && fakes.is_empty() {
            let quiet = sch.get_event_timeout(Duration::from_millis(200)).unwrap();
            assert!(quiet.is_none(), "{quiet:?}");
            break;
        }
    }
    let sent = flooder.join().unwrap();
    let (took, _cid, _qp, _cch) = client.join().expect("the real client");
    let s = cm_stats(&sctx);
    println!(
        "{sent} forged REQs, {fakes_accepted} reached the listener and ended unanswered \
         ({fakes_ended}), {} dropped at the full backlog; the real client connected in {took:?}",
        s.dropped_backlog_full
    );
    let mut got = [0u8; 17];
    smr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"through the flood");
    assert!(real.is_some());
}
