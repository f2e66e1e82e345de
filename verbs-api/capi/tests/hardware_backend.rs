//! The hardware backend of `roxe_verbs`, end to end, without RDMA
//! hardware: roxe over roxe. A second copy of the drop-in
//! `libibverbs.so.1`, loaded by the hardware backend in its own link-map
//! namespace (`ROXE_SYSTEM_LIBIBVERBS` + `ROXE_HW_ALLOW_DROP_IN=1`), plays
//! the system library; its soft device is then a "real" device reached
//! only through the C ABI (`ibv_open_device`, `ibv_create_qp`, the ops
//! table's `post_send`/`poll_cq`, ...), exactly as `mlx5_0` or `rxe0` would
//! be. A soft device of this process talks to it over loopback, so every
//! RC and UD operation crosses both backends.
//!
//! The test re-runs itself in a child process with that environment (the
//! system library is chosen once per process).

mod common;

use roxe_verbs::*;
use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);
const CHILD: &str = "ROXE_TEST_HW_CHILD";

#[test]
fn roxe_over_roxe_through_the_hardware_backend() {
    let lib = common::library();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--include-ignored"])
        .env(CHILD, "1")
        .env("ROXE_SYSTEM_LIBIBVERBS", lib)
        .env("ROXE_HW_ALLOW_DROP_IN", "1")
        // The "hardware" device's address (the inner copy's).
        .env("ROXE_ADDR", roxe_testnet::addr().to_string())
        .env_remove("ROXE_BACKEND")
        .output()
        .expect("run the child");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "the child failed: {}", out.status);
    assert!(
        text.contains("hardware backend: all checks passed"),
        "the child did not run its checks"
    );
}

fn access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// The child: only with the environment the parent sets.
#[test]
#[ignore = "run by roxe_over_roxe_through_the_hardware_backend"]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    // Listing: the soft devices first, then the system library's.
    let all = devices().unwrap();
    let hw_info = all
        .iter()
        .find(|d| d.backend() == Backend::Hardware)
        .expect("the inner library's device is listed as hardware")
        .clone();
    assert_eq!(hw_info.name(), "roxe0");
    assert_eq!(all[0].backend(), Backend::Soft, "soft devices come first");

    let hw = hw_info.open().unwrap();
    assert_eq!(hw.backend(), Backend::Hardware);
    assert!(hw.soft_device().is_none() && hw.stats().is_none());
    let hw_addr: IpAddr = std::env::var("ROXE_ADDR")
        .expect("ROXE_ADDR from the parent")
        .parse()
        .unwrap();
    assert_eq!(hw.addr(), hw_addr, "the address in the default GID");
    assert_eq!(hw.query_port(1).unwrap().state, 4);
    assert!(hw.query_port(9).is_err(), "no port 9");
    // Past the GID table (16 entries; entries 1..15 are empty).
    assert!(hw.query_gid(1, 99).is_err(), "no GID 99");
    assert_eq!(hw.query_device().phys_port_cnt, 1);

    let soft = device_with(
        "soft",
        DeviceConfig {
            addr: Some(roxe_testnet::addr().into()),
            ..DeviceConfig::default()
        },
    )
    .open()
    .unwrap();

    let (hpd, spd) = (hw.alloc_pd().unwrap(), soft.alloc_pd().unwrap());
    let hch = hw.create_comp_channel().unwrap();
    let hcq = hw.create_cq(64, Some(&hch)).unwrap();
    let scq = soft.create_cq(64, None).unwrap();
    // Objects of one backend refuse the other's.
    assert!(soft.create_cq(8, Some(&hch)).is_err());
    assert!(spd.create_qp(&QpInit::new(QpType::Rc, &hcq, &hcq)).is_err());

    let (hmr, smr) = (
        hpd.reg_mr(1 << 20, access()).unwrap(),
        spd.reg_mr(1 << 20, access()).unwrap(),
    );
    assert!(hmr.read(1 << 20, &mut [0u8; 1]).is_err(), "out of bounds");
    let hqp = hpd.create_qp(&QpInit::new(QpType::Rc, &hcq, &hcq)).unwrap();
    let sqp = spd.create_qp(&QpInit::new(QpType::Rc, &scq, &scq)).unwrap();
    assert!(hqp.cap().unwrap().max_send_wr >= 128);
    let (he, se) = (hqp.endpoint(100), sqp.endpoint(200));
    hqp.connect(100, &se, Mtu::Mtu1024, access(), 14).unwrap();
    sqp.connect(200, &he, Mtu::Mtu1024, access(), 14).unwrap();
    assert_eq!(hqp.query().unwrap().qp_state, QpState::Rts);

    // SEND with immediate, soft → hardware, with a channel event.
    hcq.req_notify(false).unwrap();
    hqp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![hmr.sge(0, 4096)],
    })
    .unwrap();
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
    smr.write(0, &data).unwrap();
    let mut w = SendWr::new(10, SendOpcode::SendWithImm, vec![smr.sge(0, 3000)]);
    w.imm_data = 0xdead_beef;
    w.flags = SendFlags::SIGNALED;
    sqp.post_send(w).unwrap();
    assert_eq!(
        hch.get_event_timeout(T).unwrap(),
        Some(hcq.id()),
        "the hardware CQ's event names it"
    );
    let rx = hcq.poll_wait(1, T).unwrap();
    assert_eq!(rx[0].status, WcStatus::Success);
    assert_eq!(rx[0].opcode, WcOpcode::Recv);
    assert_eq!((rx[0].byte_len, rx[0].imm_data), (3000, 0xdead_beef));
    assert_eq!(rx[0].qp_num, hqp.qp_num());
    let mut got = vec![0u8; 3000];
    hmr.read(0, &mut got).unwrap();
    assert_eq!(got, data, "SEND payload in the hardware MR");
    assert_eq!(scq.poll_wait(1, T).unwrap()[0].status, WcStatus::Success);

    // WRITE then READ back, hardware → soft.
    hmr.write(8192, &data).unwrap();
    let mut w = SendWr::new(20, SendOpcode::RdmaWrite, vec![hmr.sge(8192, 3000)]);
    w.remote_addr = smr.addr() + 100_000;
    w.rkey = smr.rkey();
    hqp.post_send(w).unwrap();
    let mut r = SendWr::new(21, SendOpcode::RdmaRead, vec![hmr.sge(200_000, 3000)]);
    r.remote_addr = smr.addr() + 100_000;
    r.rkey = smr.rkey();
    r.flags = SendFlags::SIGNALED;
    hqp.post_send(r).unwrap();
    // (SendWr::new signals by default: both complete.)
    let tx = hcq.poll_wait(2, T).unwrap();
    assert_eq!((tx[1].wr_id, tx[1].status), (21, WcStatus::Success));
    assert_eq!((tx[0].wr_id, tx[0].opcode), (20, WcOpcode::RdmaWrite));
    hmr.read(200_000, &mut got).unwrap();
    assert_eq!(got, data, "READ returns what WRITE wrote");

    // Atomics on the soft side's memory, and inline data.
    smr.write(500_000, &40u64.to_ne_bytes()).unwrap();
    let mut f = SendWr::new(30, SendOpcode::AtomicFetchAndAdd, vec![hmr.sge(300_000, 8)]);
    f.remote_addr = smr.addr() + 500_000;
    f.rkey = smr.rkey();
    f.compare_add = 2;
    f.flags = SendFlags::SIGNALED;
    hqp.post_send(f).unwrap();
    assert_eq!(hcq.poll_wait(1, T).unwrap()[0].status, WcStatus::Success);
    let mut word = [0u8; 8];
    hmr.read(300_000, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 40);
    smr.read(500_000, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 42);
    sqp.post_recv(RecvWr {
        wr_id: 2,
        sg_list: vec![smr.sge(600_000, 64)],
    })
    .unwrap();
    let mut i = SendWr::new(31, SendOpcode::Send, Vec::new());
    i.inline_data = Some(b"inline from hardware".to_vec());
    i.flags = SendFlags(SendFlags::INLINE.0 | SendFlags::SIGNALED.0);
    hqp.post_send(i).unwrap();
    assert_eq!(hcq.poll_wait(1, T).unwrap()[0].status, WcStatus::Success);
    let rx = scq.poll_wait(1, T).unwrap();
    assert_eq!((rx[0].wr_id, rx[0].byte_len), (2, 20));
    let mut b = [0u8; 20];
    smr.read(600_000, &mut b).unwrap();
    assert_eq!(&b, b"inline from hardware");

    // A bad rkey: the hardware side's WRITE completes in error, its QP
    // goes to ERROR (an async-visible state), as on a NIC.
    let mut bad = SendWr::new(40, SendOpcode::RdmaWrite, vec![hmr.sge(0, 16)]);
    bad.remote_addr = smr.addr();
    bad.rkey = smr.rkey() ^ 0x100;
    hqp.post_send(bad).unwrap();
    let e = hcq.poll_wait(1, T).unwrap();
    assert_eq!(e[0].status, WcStatus::RemAccessErr);
    assert_eq!(hqp.query().unwrap().qp_state, QpState::Err);

    // UD, both ways, with an AH on each side.
    let (hud_cq, sud_cq) = (
        hw.create_cq(16, None).unwrap(),
        soft.create_cq(16, None).unwrap(),
    );
    let hud = hpd
        .create_qp(&QpInit::new(QpType::Ud, &hud_cq, &hud_cq))
        .unwrap();
    let sud = spd
        .create_qp(&QpInit::new(QpType::Ud, &sud_cq, &sud_cq))
        .unwrap();
    hud.ready_ud(0x1111, 1).unwrap();
    sud.ready_ud(0x1111, 2).unwrap();
    let av = |gid: [u8; 16], sgid_index| AddressVector {
        dgid: gid,
        sgid_index,
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..AddressVector::default()
    };
    let hah = hpd
        .create_ah(&av(soft.query_gid(1, 0).unwrap(), hw.default_gid_index()))
        .unwrap();
    let sah = spd.create_ah(&av(he.gid, 0)).unwrap();
    sud.post_recv(RecvWr {
        wr_id: 3,
        sg_list: vec![smr.sge(700_000, 40 + 100)],
    })
    .unwrap();
    hud.post_recv(RecvWr {
        wr_id: 4,
        sg_list: vec![hmr.sge(700_000, 40 + 100)],
    })
    .unwrap();
    let mut u = SendWr::new(50, SendOpcode::Send, vec![hmr.sge(0, 100)]);
    u.ud = Some(hah.dest(sud.qp_num(), 0x1111));
    u.flags = SendFlags::SIGNALED;
    hud.post_send(u).unwrap();
    let mut u = SendWr::new(51, SendOpcode::Send, vec![smr.sge(0, 100)]);
    u.ud = Some(sah.dest(hud.qp_num(), 0x1111));
    u.flags = SendFlags::SIGNALED;
    sud.post_send(u).unwrap();
    let hrx: Vec<_> = hud_cq.poll_wait(2, T).unwrap();
    let srx: Vec<_> = sud_cq.poll_wait(2, T).unwrap();
    let recv = |v: &[WorkCompletion]| {
        v.iter()
            .find(|c| c.opcode == WcOpcode::Recv)
            .copied()
            .unwrap()
    };
    assert_eq!(recv(&hrx).src_qp, sud.qp_num());
    assert_eq!(recv(&srx).src_qp, hud.qp_num());
    assert!(hrx
        .iter()
        .chain(&srx)
        .all(|c| c.status == WcStatus::Success));
    // A UD send to an address without an AH on this device: EINVAL.
    let mut u = SendWr::new(52, SendOpcode::Send, vec![hmr.sge(0, 1)]);
    u.ud = Some(UdDest {
        addr: roxe_testnet::addr().into(),
        remote_qpn: 1,
        remote_qkey: 1,
    });
    assert_eq!(hud.post_send(u).unwrap_err().errno(), libc::EINVAL);

    // SRQ on the hardware side.
    let srq = hpd.create_srq(16, 1).unwrap();
    srq.post_recv(RecvWr {
        wr_id: 5,
        sg_list: vec![hmr.sge(800_000, 64)],
    })
    .unwrap();

    // Objects drop in any order the handles allow; the device closes last.
    drop((hqp, sqp, hud, sud, hah, sah, srq));
    println!("hardware backend: all checks passed");
}
