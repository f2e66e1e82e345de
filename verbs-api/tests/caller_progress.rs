//! Progress in the caller's thread: a `poll_cq` that finds nothing receives
//! from the socket itself (`DeviceConfig::caller_progress`, on by default),
//! so a ping-pong's packets are handled by the polling threads; with it off
//! only the progress thread receives. Both ways the data arrives intact.

use roxe_verbs::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);
const ROUNDS: u32 = 300;

fn open(name: &str, addr: &str, caller_progress: bool) -> Context {
    let config = DeviceConfig {
        addr: Some(addr.parse().unwrap()),
        caller_progress,
        ..DeviceConfig::default()
    };
    device_with(name, config).open().unwrap()
}

struct Side {
    ctx: Context,
    qp: Qp,
    cq: Cq,
    mr: Mr,
    _pd: Pd,
}

fn side(ctx: Context) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    Side {
        ctx,
        qp,
        cq,
        mr,
        _pd: pd,
    }
}

/// Polls like a program spinning on `ibv_poll_cq`, checking each
/// completion's status.
fn one(s: &Side) -> WorkCompletion {
    let wcs = s.cq.poll_wait(1, T).unwrap();
    assert_eq!(wcs[0].status, WcStatus::Success, "{:?}", wcs[0]);
    wcs[0]
}

/// SENDs of 64 bytes back and forth; returns the caller-thread receive
/// bursts of each side.
fn ping_pong(na: &str, aa: &str, nb: &str, ab: &str, caller_progress: bool) -> (u64, u64) {
    let a = side(open(na, aa, caller_progress));
    let b = side(open(nb, ab, caller_progress));
    let access = AccessFlags::LOCAL_WRITE;
    a.qp.connect(1, &b.qp.endpoint(2), Mtu::Mtu1024, access, 14)
        .unwrap();
    b.qp.connect(2, &a.qp.endpoint(1), Mtu::Mtu1024, access, 14)
        .unwrap();
    let recv = |s: &Side, id| {
        s.qp.post_recv(RecvWr {
            wr_id: id,
            sg_list: vec![s.mr.sge(2048, 64)],
        })
        .unwrap()
    };
    for round in 0..ROUNDS {
        let (from, to) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        recv(to, u64::from(round));
        let stamp = round.to_le_bytes();
        from.mr.write(0, &stamp).unwrap();
        from.qp
            .post_send(SendWr::new(
                u64::from(round),
                SendOpcode::Send,
                vec![from.mr.sge(0, 64)],
            ))
            .unwrap();
        // The receiver polls first: its completion is what a caller's
        // receive delivers without the progress thread.
        let got = one(to);
        assert_eq!(got.wr_id, u64::from(round));
        assert_eq!(got.byte_len, 64);
        let mut back = [0u8; 4];
        to.mr.read(2048, &mut back).unwrap();
        assert_eq!(back, stamp, "round {round}");
        assert_eq!(one(from).wr_id, u64::from(round));
    }
    let caller = |s: &Side| s.ctx.stats().unwrap().driver.rx_caller_batches;
    (caller(&a), caller(&b))
}

#[test]
fn polling_threads_receive_for_themselves() {
    let (a, b) = ping_pong("cp-a", "127.0.228.11", "cp-b", "127.0.228.12", true);
    assert!(a > 0 && b > 0, "caller-thread bursts: a {a}, b {b}");
}

#[test]
fn with_caller_progress_off_only_the_progress_thread_receives() {
    let (a, b) = ping_pong("cpo-a", "127.0.228.13", "cpo-b", "127.0.228.14", false);
    assert_eq!((a, b), (0, 0));
}
