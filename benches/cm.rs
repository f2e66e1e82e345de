//! Connection setup through rdma_cm over real loopback sockets: two roxe
//! devices in one process (one listens, the other connects; addresses from
//! `roxe_testnet`), the CM's REQ/REP/RTU on QP1 between them.
//!
//! - `cm/connect_to_established`: one connection at a time, from
//!   `connect` to ESTABLISHED on both sides (QPs moved to RTS on the way),
//!   then torn down out of the measurement; before the criterion runs,
//!   the same over 2,000 connections is printed as p50/p90/p99.
//! - `cm/connections_in_flight/N`: N connects posted at once, until all N
//!   are established on both sides; criterion's throughput line is the
//!   connection rate.
//!
//! `cargo bench --bench cm`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use roxe_verbs::cm::*;
use roxe_verbs::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

struct Server {
    ch: EventChannel,
    _listen: CmId,
    pd: Pd,
    cq: Cq,
    keep: Vec<(CmId, Qp)>,
}

struct Client {
    ch: EventChannel,
    pd: Pd,
    cq: Cq,
    dst: SocketAddr,
    src: SocketAddr,
    keep: Vec<(CmId, Qp)>,
}

fn event(ch: &EventChannel) -> Event {
    ch.get_event_timeout(WAIT)
        .expect("rdma_get_cm_event")
        .expect("an event in time")
}

/// Establish `n` connections at once; the server side answers as requests
/// come, both sides' QPs end in RTS. Returns the time from the first
/// `connect` to the last ESTABLISHED.
fn establish(s: &mut Server, c: &mut Client, n: usize) -> Duration {
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        let id = CmId::new(&c.ch, PortSpace::Tcp);
        id.resolve_addr(Some(c.src), c.dst).unwrap();
        ids.push(id);
    }
    let (mut resolved, mut routed) = (0, 0);
    let mut first_connect = None;
    while routed < n {
        let e = event(&c.ch);
        match e.kind {
            EventKind::AddrResolved => {
                e.id.resolve_route().unwrap();
                resolved += 1;
            }
            EventKind::RouteResolved => {
                let qp =
                    e.id.create_qp(Some(&c.pd), &QpInit::new(QpType::Rc, &c.cq, &c.cq))
                        .unwrap();
                first_connect.get_or_insert_with(Instant::now);
                e.id.connect(&ConnParam::default()).unwrap();
                c.keep.push((e.id, qp));
                routed += 1;
            }
            k => panic!("client: {k:?}"),
        }
    }
    assert_eq!(resolved, n);
    let (mut est_c, mut est_s) = (0, 0);
    let t0 = Instant::now();
    while est_c < n || est_s < n {
        assert!(t0.elapsed() < WAIT, "{est_c} {est_s} of {n}");
        // Sleep on both channels' fds, as an event loop would.
        let mut fds = [
            rustix::event::PollFd::new(&s.ch, rustix::event::PollFlags::IN),
            rustix::event::PollFd::new(&c.ch, rustix::event::PollFlags::IN),
        ];
        let ts = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 10_000_000,
        };
        let _ = rustix::event::poll(&mut fds, Some(&ts));
        while let Some(e) = s.ch.try_get_event().unwrap() {
            match e.kind {
                EventKind::ConnectRequest => {
                    let qp =
                        e.id.create_qp(Some(&s.pd), &QpInit::new(QpType::Rc, &s.cq, &s.cq))
                            .unwrap();
                    e.id.accept(&ConnParam::default()).unwrap();
                    s.keep.push((e.id, qp));
                }
                EventKind::Established => est_s += 1,
                k => panic!("server: {k:?}"),
            }
        }
        while let Some(e) = c.ch.try_get_event().unwrap() {
            assert_eq!(e.kind, EventKind::Established, "{:?}", e.status);
            est_c += 1;
        }
    }
    first_connect.map_or(Duration::ZERO, |t| t.elapsed())
}

/// The figure: one connection at a time, from `connect` to
/// ESTABLISHED on both sides; prints percentiles over `n` connections.
fn connect_percentiles(s: &mut Server, c: &mut Client, n: usize) {
    let mut t: Vec<Duration> = (0..n)
        .map(|_| {
            let d = establish(s, c, 1);
            s.keep.clear();
            c.keep.clear();
            d
        })
        .collect();
    t.sort();
    let pct = |p: usize| t[(t.len() * p / 100).min(t.len() - 1)].as_secs_f64() * 1e6;
    println!(
        "cm/connect_to_established_percentiles: {n} connections, p50 {:.1} µs, p90 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        pct(50),
        pct(90),
        pct(99),
        t[t.len() - 1].as_secs_f64() * 1e6
    );
}

fn setup() -> (Server, Client) {
    let sch = EventChannel::new().unwrap();
    let listen = CmId::new(&sch, PortSpace::Tcp);
    let dst = SocketAddr::from((roxe_testnet::addr(), roxe_testnet::port()));
    listen.bind_addr(dst).unwrap();
    listen.listen(1024).unwrap();
    let sctx = listen.context().unwrap();
    let src = SocketAddr::from((roxe_testnet::addr(), 0));
    let cctx = open_at(src.ip()).unwrap();
    let server = Server {
        ch: sch,
        _listen: listen,
        pd: sctx.alloc_pd().unwrap(),
        cq: sctx.create_cq(4096, None).unwrap(),
        keep: Vec::new(),
    };
    let client = Client {
        ch: EventChannel::new().unwrap(),
        pd: cctx.alloc_pd().unwrap(),
        cq: cctx.create_cq(4096, None).unwrap(),
        dst,
        src,
        keep: Vec::new(),
    };
    (server, client)
}

fn cm(c: &mut Criterion) {
    let (mut s, mut cl) = setup();
    connect_percentiles(&mut s, &mut cl, 2000);
    let mut g = c.benchmark_group("cm");
    g.sample_size(20);
    g.bench_function("connect_to_established", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                total += establish(&mut s, &mut cl, 1);
                // Dropping the ids frees their CM state and QPs; no DREQ.
                s.keep.clear();
                cl.keep.clear();
            }
            total
        })
    });
    for n in [64usize, 256] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("connections_in_flight", n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t0 = Instant::now();
                    establish(&mut s, &mut cl, n);
                    total += t0.elapsed();
                    s.keep.clear();
                    cl.keep.clear();
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, cm);
criterion_main!(benches);
