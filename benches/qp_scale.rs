//! QPs at scale on real devices (two soft devices in one process, on
//! loopback addresses from `roxe_testnet`): how fast RC QP pairs are created and
//! connected (RESET → INIT → RTR → RTS on both sides, through the Rust API
//! as a program would), and what an idle connected QP costs in memory
//! (resident set growth of the process per QP, `VmRSS` in /proc/self/status).
//! Prints its figures; no criterion timing (one pass of 10,000 pairs is the
//! measurement).
//!
//! `cargo bench --bench qp_scale [-- PAIRS]` (default 5,000 pairs =
//! 10,000 QPs).

use roxe_verbs::*;
use std::time::Instant;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

fn open(name: &str, addr: &str) -> Context {
    let config = DeviceConfig {
        addr: Some(addr.parse().unwrap()),
        ..DeviceConfig::default()
    };
    device_with(name, config)
        .open()
        .expect("open a soft device")
}

fn main() {
    let pairs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(5_000);
    let [a, b] = roxe_testnet::addrs().map(|a| a.to_string());
    let (a, b) = (open("scale-a", &a), open("scale-b", &b));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (
        a.create_cq(1024, None).unwrap(),
        b.create_cq(1024, None).unwrap(),
    );
    // Small queues, as a program holding thousands of idle QPs sizes them.
    let init = |cq| {
        let mut i = QpInit::new(QpType::Rc, cq, cq);
        i.cap.max_send_wr = 16;
        i.cap.max_recv_wr = 16;
        i
    };
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    // Warm the allocator and the devices with one pair before measuring.
    let warm = (
        pa.create_qp(&init(&ca)).unwrap(),
        pb.create_qp(&init(&cb)).unwrap(),
    );
    let rss0 = rss_bytes();
    let start = Instant::now();
    let mut keep = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let qa = pa.create_qp(&init(&ca)).unwrap();
        let qb = pb.create_qp(&init(&cb)).unwrap();
        let psn = (i as u32 * 7) & 0xff_ffff;
        qa.connect(psn, &qb.endpoint(psn), Mtu::Mtu4096, access, 14)
            .unwrap();
        qb.connect(psn, &qa.endpoint(psn), Mtu::Mtu4096, access, 14)
            .unwrap();
        keep.push((qa, qb));
    }
    let took = start.elapsed();
    let rss1 = rss_bytes();
    let qps = 2 * pairs;
    println!(
        "qp_scale: {qps} RC QPs created and connected (RTS) in {:.3} s: {:.0} QPs/s ({:.0} pairs/s)",
        took.as_secs_f64(),
        qps as f64 / took.as_secs_f64(),
        pairs as f64 / took.as_secs_f64()
    );
    println!(
        "qp_scale: resident set +{:.1} MiB for {qps} idle connected QPs: {:.0} bytes per QP \
         (send/recv depth 16, both devices and the API objects included)",
        (rss1.saturating_sub(rss0)) as f64 / (1 << 20) as f64,
        rss1.saturating_sub(rss0) as f64 / qps as f64
    );
    // Idle means idle: a while later nothing was sent or retransmitted.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let sa = a.stats().unwrap();
    println!(
        "qp_scale: after 300 ms idle: {} datagrams sent, {} retransmits",
        sa.driver.tx_datagrams, sa.engine.tx_retransmits
    );
    drop(keep);
    drop(warm);
}
