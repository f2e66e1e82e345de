//! Progress in the caller's thread: a `poll_cq` that finds nothing receives
//! from the socket itself (`PacingConfig::caller_progress`, on by default).
//! With both devices' progress threads paused, a ping-pong still completes,
//! intact, through the polling threads alone; with caller progress off it
//! cannot, and resumes once the progress threads do.

mod common;

use roxe_verbs::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);
const ROUNDS: u32 = 300;

fn open(name: &str, caller_progress: bool) -> Context {
    let base = DeviceConfig {
        pacing: PacingConfig {
            caller_progress,
            // Timers run on the progress thread, which these tests pause:
            // an ACK held for an answer (this ping-pong answers only after
            // the sender's completion) would wait for it forever.
            ack_hold: false,
            ..PacingConfig::default()
        },
        ..DeviceConfig::default()
    };
    common::open_with(name, base)
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

/// Polls like a program spinning on `ibv_poll_cq`, checking the
/// completion's status.
fn one(s: &Side) -> WorkCompletion {
    let wcs = s.cq.poll_wait(1, T).unwrap();
    assert_eq!(wcs[0].status, WcStatus::Success, "{:?}", wcs[0]);
    wcs[0]
}

/// SENDs of 64 bytes back and forth with both progress threads paused.
/// Returns the rounds completed before a completion failed to come, and
/// the caller-thread receive bursts of each side.
fn ping_pong(na: &str, nb: &str, caller_progress: bool) -> (u32, u64, u64, Side, Side) {
    let a = side(open(na, caller_progress));
    let b = side(open(nb, caller_progress));
    let access = AccessFlags::LOCAL_WRITE;
    a.qp.connect(1, &b.qp.endpoint(2), Mtu::Mtu1024, access, 14)
        .unwrap();
    b.qp.connect(2, &a.qp.endpoint(1), Mtu::Mtu1024, access, 14)
        .unwrap();
    for s in [&a, &b] {
        s.ctx.soft_device().unwrap().pause_progress_thread(true);
    }
    let wait = if caller_progress {
        T
    } else {
        Duration::from_millis(300)
    };
    let mut rounds = 0;
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
        // The receiver polls first: only its own receive can deliver.
        let Ok(got) = to.cq.poll_wait(1, wait) else {
            break;
        };
        assert_eq!(got[0].status, WcStatus::Success, "{:?}", got[0]);
        assert_eq!(got[0].wr_id, u64::from(round));
        assert_eq!(got[0].byte_len, 64);
        let mut back = [0u8; 4];
        to.mr.read(2048, &mut back).unwrap();
        assert_eq!(back, stamp, "round {round}");
        assert_eq!(one(from).wr_id, u64::from(round));
        rounds += 1;
    }
    let caller = |s: &Side| s.ctx.stats().unwrap().driver.rx_caller_batches;
    (rounds, caller(&a), caller(&b), a, b)
}

fn recv(s: &Side, id: u64) {
    s.qp.post_recv(RecvWr {
        wr_id: id,
        sg_list: vec![s.mr.sge(2048, 64)],
    })
    .unwrap()
}

#[test]
fn polling_threads_receive_for_themselves() {
    let (rounds, a, b, _, _) = ping_pong("cp-a", "cp-b", true);
    assert_eq!(rounds, ROUNDS, "every round through the callers' threads");
    assert!(a > 0 && b > 0, "caller-thread bursts: a {a}, b {b}");
}

#[test]
fn with_caller_progress_off_only_the_progress_thread_receives() {
    let (rounds, a, b, sa, sb) = ping_pong("cpo-a", "cpo-b", false);
    assert_eq!((rounds, a, b), (0, 0, 0), "nothing moves while paused");
    // The first SEND waits at b; the progress threads deliver it.
    for s in [&sa, &sb] {
        s.ctx.soft_device().unwrap().pause_progress_thread(false);
    }
    assert_eq!(one(&sb).wr_id, 0);
    assert_eq!(one(&sa).wr_id, 0);
}
