//! rdma_cm's flow in Rust: a server thread listens, a client resolves the
//! server's address and route, connects with private data, and the two
//! ping-pong SENDs over the connected QPs, then disconnect. The server and
//! the client each take a free loopback address (two devices in one
//! process), so nothing needs configuring.
//!
//! `cargo run -p roxe-verbs --example cm_pingpong`

use roxe_verbs::cm::*;
use roxe_verbs::*;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);
const ROUNDS: u64 = 100;

fn event(ch: &EventChannel, want: EventKind) -> Result<Event> {
    let e = ch
        .get_event_timeout(T)?
        .ok_or_else(|| std::io::Error::other(format!("no {want:?} within {T:?}")))
        .map_err(|e| Error::Io {
            verb: "rdma_get_cm_event",
            source: e,
        })?;
    if e.kind != want {
        return Err(Error::Io {
            verb: "rdma_get_cm_event",
            source: std::io::Error::other(format!(
                "wanted {want:?}, got {:?} (status {})",
                e.kind, e.status
            )),
        });
    }
    Ok(e)
}

/// A QP on the id's device with a CQ and a 4 KiB buffer.
fn endpoint(id: &CmId) -> Result<(Qp, Cq, Mr)> {
    let ctx = id.context().expect("bound");
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16, None)?;
    let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE)?;
    let qp = id.create_qp(Some(&pd), &QpInit::new(QpType::Rc, &cq, &cq))?;
    Ok((qp, cq, mr))
}

fn post_recv(qp: &Qp, mr: &Mr) -> Result<()> {
    qp.post_recv(RecvWr {
        wr_id: 0,
        sg_list: vec![mr.sge(1024, 8)],
    })
}

/// A receive is always posted before the peer can send (the first one
/// before the connection is accepted or made), so no message finds none,
/// which would cost an RNR wait.
fn pingpong(qp: &Qp, cq: &Cq, mr: &Mr, first: bool) -> Result<()> {
    let recv = || post_recv(qp, mr);
    for i in 0..ROUNDS {
        if first {
            mr.write(0, &i.to_le_bytes())?;
            qp.post_send(SendWr::new(i, SendOpcode::Send, vec![mr.sge(0, 8)]))?;
        }
        let (mut got_recv, mut sent) = (false, !first);
        while !(got_recv && sent) {
            for wc in cq.poll_wait(1, T)? {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                match wc.opcode {
                    WcOpcode::Recv => got_recv = true,
                    _ => sent = true,
                }
            }
        }
        let mut b = [0u8; 8];
        mr.read(1024, &mut b)?;
        assert_eq!(u64::from_le_bytes(b), i, "message {i}");
        recv()?;
        if !first {
            mr.write(0, &b)?;
            qp.post_send(SendWr::new(i, SendOpcode::Send, vec![mr.sge(0, 8)]))?;
            cq.poll_wait(1, T)?;
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let (tx, rx) = mpsc::channel::<SocketAddr>();
    let server = std::thread::spawn(move || -> Result<()> {
        let ch = EventChannel::new()?;
        let listen = CmId::new(&ch, PortSpace::Tcp);
        // A device of its own on the first free loopback address.
        let ctx = device_with("roxe-cm-example-server", DeviceConfig::default()).open()?;
        listen.bind_addr(SocketAddr::new(ctx.addr(), 7471))?;
        listen.listen(1)?;
        tx.send(listen.local_addr().expect("bound"))
            .expect("main waits");
        let req = event(&ch, EventKind::ConnectRequest)?;
        println!(
            "server: connect request from {:?}: {:?}",
            req.id.peer_addr(),
            String::from_utf8_lossy(&req.param.private_data[..12])
        );
        let (qp, cq, mr) = endpoint(&req.id)?;
        post_recv(&qp, &mr)?;
        req.id.accept(&ConnParam::default())?;
        event(&ch, EventKind::Established)?;
        pingpong(&qp, &cq, &mr, false)?;
        event(&ch, EventKind::Disconnected)?;
        req.id.disconnect()?;
        event(&ch, EventKind::TimewaitExit)?;
        Ok(())
    });
    let dst = rx.recv_timeout(T).expect("the server binds");
    let ch = EventChannel::new()?;
    let id = CmId::new(&ch, PortSpace::Tcp);
    let client = device_with("roxe-cm-example-client", DeviceConfig::default()).open()?;
    id.resolve_addr(Some(SocketAddr::new(client.addr(), 0)), dst)?;
    event(&ch, EventKind::AddrResolved)?;
    id.resolve_route()?;
    event(&ch, EventKind::RouteResolved)?;
    let (qp, cq, mr) = endpoint(&id)?;
    post_recv(&qp, &mr)?;
    id.connect(&ConnParam {
        private_data: b"hello server".to_vec(),
        ..ConnParam::default()
    })?;
    event(&ch, EventKind::Established)?;
    println!(
        "client: connected {:?} -> {:?}",
        id.local_addr(),
        id.peer_addr()
    );
    let t0 = std::time::Instant::now();
    pingpong(&qp, &cq, &mr, true)?;
    println!(
        "client: {ROUNDS} round trips, {:.1} µs each",
        t0.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64
    );
    id.disconnect()?;
    event(&ch, EventKind::Disconnected)?;
    event(&ch, EventKind::TimewaitExit)?;
    server.join().expect("server thread")?;
    println!("ok");
    Ok(())
}
