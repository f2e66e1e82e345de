//! The liveness watchdog and the retry-exhaustion log, on one engine.

use super::*;
use crate::memory::Sge;
use crate::qp_attr::AddressVector;
use crate::qp_attr::Mtu;
use crate::qp_attr::{AttrMask, QpAttr, QpState, QpType};
use crate::types::AccessFlags;
use crate::types::{WcOpcode, WcStatus};
use crate::wr::SendOpcode;
use crate::wr::{SendWr, WorkCompletion};

/// An RC QP in RTS facing 127.0.0.2 with one WRITE sent.
fn engine_with_a_write_in_flight() -> (Engine, u32) {
    let mut e = Engine::new(EngineConfig::new("127.0.0.1".parse().unwrap()));
    let pd = e.alloc_pd();
    let cq = e.create_cq(16).unwrap();
    let mr = e
        .memory_mut()
        .register_owned(pd, 4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let qpn = e
        .create_qp(QpInitAttr {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            xrcd: None,
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: true,
        })
        .unwrap();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    e.modify_qp(
        qpn,
        &a,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = Mtu::Mtu1024;
    a.dest_qp_num = 0x12;
    a.av = AddressVector {
        dgid: gid_of("127.0.0.2".parse().unwrap()),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..AddressVector::default()
    };
    e.modify_qp(
        qpn,
        &a,
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER,
    )
    .unwrap();
    a.qp_state = QpState::Rts;
    a.timeout = 10;
    a.retry_cnt = 2;
    e.modify_qp(
        qpn,
        &a,
        AttrMask::STATE
            | AttrMask::SQ_PSN
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
    let sge = Sge {
        addr: mr.addr,
        length: 100,
        lkey: mr.lkey,
    };
    let mut wr = SendWr::new(7, SendOpcode::RdmaWrite, vec![sge]);
    wr.rkey = 0x100;
    e.post_send(qpn, wr).unwrap();
    let mut buf = vec![0u8; 8192];
    assert!(e.poll_transmit(0, &mut buf).is_some());
    (e, qpn)
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// Runs `f` with a subscriber at `level` as this thread's default and returns
/// what its second run logged. tracing caches each callsite's interest
/// globally, and while only one dispatcher exists a callsite first hit by
/// another test's thread (no subscriber there) is cached as "never". So these
/// tests take turns; the first run registers every callsite `f` reaches, the
/// rebuild then asks our dispatcher about each, and the second run is logged.
fn with_captured_log<T>(level: tracing::Level, mut f: impl FnMut() -> T) -> (T, String) {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let log = Captured::default();
    let sub = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_max_level(level)
        .with_ansi(false)
        .finish();
    let out = tracing::subscriber::with_default(sub, || {
        f();
        tracing::callsite::rebuild_interest_cache();
        log.0.lock().unwrap().clear();
        f()
    });
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    (out, text)
}

#[test]
fn retry_exhaustion_is_logged_with_its_qp() {
    let (qpn, text) = with_captured_log(tracing::Level::DEBUG, || {
        let (mut e, qpn) = engine_with_a_write_in_flight();
        let mut buf = vec![0u8; 8192];
        for _ in 0..10 {
            let Some(d) = e.poll_timeout() else { break };
            e.handle_timeout(d);
            while e.poll_transmit(d, &mut buf).is_some() {}
        }
        qpn
    });
    let q = format!("qpn={qpn:#x}");
    assert!(
        text.lines()
            .any(|l| l.contains("retransmission timeout") && l.contains(&q)),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("go-back-N") && l.contains(&q)),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.contains("WARN")
            && l.contains("retries exhausted")
            && l.contains(&q)
            && l.contains("RetryExcErr")),
        "{text}"
    );
    assert!(text.contains("QP entered ERR"), "{text}");
}

#[test]
fn a_healthy_engine_passes_the_audit() {
    let (mut e, _) = engine_with_a_write_in_flight();
    assert!(e.poll_timeout().is_some());
    assert_eq!(e.audit_liveness(1), 0);
    assert_eq!(e.stats().stalls_repaired, 0);
}

#[test]
fn a_lost_timer_is_found_counted_and_rearmed() {
    let (mut e, qpn) = engine_with_a_write_in_flight();
    // Simulate the class of bug: the timer of a message in flight gone.
    if let Some(q) = e.qps.get_mut(&qpn) {
        q.timers.stop(super::timer::Timer::Retransmit);
        assert!(q.liveness_violation().is_some());
    }
    e.refile_deadline(qpn);
    assert_eq!(e.deadlines.len(), 0, "nothing would ever wake this QP");
    assert_eq!(e.audit_liveness(1_000), 1);
    assert_eq!(e.stats().stalls_repaired, 1);
    // The repair: a timer that retransmits, then gives up.
    let mut buf = vec![0u8; 8192];
    let mut status = None;
    for _ in 0..10 {
        let Some(d) = e.poll_timeout() else { break };
        e.handle_timeout(d);
        while e.poll_transmit(d, &mut buf).is_some() {}
        let mut wc = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0)];
        if e.poll_cq(e.qps[&qpn].init.send_cq, &mut wc).unwrap() == 1 {
            status = Some(wc[0].status);
            break;
        }
    }
    assert_eq!(status, Some(WcStatus::RetryExcErr));
    assert!(e.stats().tx_retransmits >= 2);
}

#[test]
fn packets_are_traced_at_trace_level_only() {
    let capture = |level| with_captured_log(level, engine_with_a_write_in_flight).1;
    let trace = capture(tracing::Level::TRACE);
    assert!(
        trace.lines().any(|l| l.contains("packet sent")
            && l.contains("opcode=RC_RDMA_WRITE_ONLY")
            && l.contains("dest_qpn=0x12")
            && l.contains("dst=127.0.0.2")),
        "{trace}"
    );
    let debug = capture(tracing::Level::DEBUG);
    assert!(!debug.contains("packet sent"), "{debug}");
    assert!(debug.contains("QP state change"), "{debug}");
}
