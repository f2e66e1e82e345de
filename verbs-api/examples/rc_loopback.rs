//! Two devices in one process, an RC QP pair between them, and every RC
//! operation: SEND, SEND_WITH_IMM, RDMA WRITE, WRITE_WITH_IMM, READ,
//! FETCH_ADD, CMP_SWAP. Exits non-zero on any mismatch.
//!
//! `cargo run -p roxe-verbs --example rc_loopback`: two soft devices (each
//! takes the next free loopback address).
//! `rc_loopback A B [C D ...]`: pairs of the devices [`devices`] lists by
//! those names, soft or hardware, all open at once and exercised at the
//! same time (one thread per pair); `soft` names a fresh soft device on
//! the next free loopback address. `rc_loopback rxe0 rxe0 soft soft`: the
//! kernel's rxe0 and two roxe devices in one program. The code is the
//! same for both backends.

use roxe_verbs::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

fn main() -> Result<()> {
    let mut names: Vec<String> = std::env::args().skip(1).collect();
    if names.is_empty() {
        names = vec!["soft".into(), "soft".into()];
    }
    if !names.len().is_multiple_of(2) {
        names.push(names[names.len() - 1].clone());
    }
    let mut pairs = Vec::new();
    for (i, p) in names.chunks(2).enumerate() {
        pairs.push((open_named(&p[0], i * 2)?, open_named(&p[1], i * 2 + 1)?));
    }
    let threads: Vec<_> = pairs
        .into_iter()
        .map(|(a, b)| std::thread::spawn(move || exercise(a, b)))
        .collect();
    let mut failed = false;
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                eprintln!("FAIL {e}");
                failed = true;
            }
            Err(_) => failed = true,
        }
    }
    if failed {
        std::process::exit(1);
    }
    Ok(())
}

/// Every RC operation from `a` to `b`, checked.
fn exercise(a: Context, b: Context) -> Result<()> {
    println!(
        "device a {} {:?} {} (lid {}), device b {} {:?} {} (lid {})",
        a.name(),
        a.backend(),
        a.addr(),
        a.query_port(1)?.lid,
        b.name(),
        b.backend(),
        b.addr(),
        b.query_port(1)?.lid
    );
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    let (ca, cb) = (a.create_cq(64, None)?, b.create_cq(64, None)?);
    let (ma, mb) = (pa.reg_mr(1 << 20, access)?, pb.reg_mr(1 << 20, access)?);
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca))?;
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb))?;
    let (ea, eb) = (qa.endpoint(100), qb.endpoint(200));
    qa.connect(100, &eb, Mtu::Mtu1024, access, 14)?;
    qb.connect(200, &ea, Mtu::Mtu1024, access, 14)?;

    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
    ma.write(0, &data)?;

    // SEND and SEND_WITH_IMM.
    qb.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![mb.sge(0, 16384)],
    })?;
    qb.post_recv(RecvWr {
        wr_id: 2,
        sg_list: vec![mb.sge(16384, 16384)],
    })?;
    qa.post_send(SendWr::new(10, SendOpcode::Send, vec![ma.sge(0, 10_000)]))?;
    let mut w = SendWr::new(11, SendOpcode::SendWithImm, vec![ma.sge(0, 100)]);
    w.imm_data = 0xdead_beef;
    qa.post_send(w)?;
    let rx = cb.poll_wait(2, T)?;
    let tx = ca.poll_wait(2, T)?;
    check(
        rx.iter().all(|c| c.status == WcStatus::Success),
        "receives ok",
    )?;
    check(
        rx[0].byte_len == 10_000 && rx[1].imm_data == 0xdead_beef,
        "receive lengths and imm",
    )?;
    check(tx.iter().all(|c| c.status == WcStatus::Success), "sends ok")?;
    let mut got = vec![0u8; 10_000];
    mb.read(0, &mut got)?;
    check(got == data, "SEND data")?;

    // RDMA WRITE, then READ it back.
    let mut w = SendWr::new(20, SendOpcode::RdmaWrite, vec![ma.sge(0, 10_000)]);
    w.remote_addr = mb.addr() + 100_000;
    w.rkey = mb.rkey();
    qa.post_send(w)?;
    let mut r = SendWr::new(21, SendOpcode::RdmaRead, vec![ma.sge(200_000, 10_000)]);
    r.remote_addr = mb.addr() + 100_000;
    r.rkey = mb.rkey();
    qa.post_send(r)?;
    let tx = ca.poll_wait(2, T)?;
    check(
        tx.iter().all(|c| c.status == WcStatus::Success),
        "WRITE + READ ok",
    )?;
    ma.read(200_000, &mut got)?;
    check(got == data, "READ returns what WRITE wrote")?;

    // Atomics on an 8-byte word of b.
    mb.write(500_000, &40u64.to_ne_bytes())?;
    let mut f = SendWr::new(30, SendOpcode::AtomicFetchAndAdd, vec![ma.sge(300_000, 8)]);
    f.remote_addr = mb.addr() + 500_000;
    f.rkey = mb.rkey();
    f.compare_add = 2;
    qa.post_send(f)?;
    let mut c = SendWr::new(31, SendOpcode::AtomicCmpAndSwp, vec![ma.sge(300_008, 8)]);
    c.remote_addr = mb.addr() + 500_000;
    c.rkey = mb.rkey();
    c.compare_add = 42;
    c.swap = 7;
    qa.post_send(c)?;
    let tx = ca.poll_wait(2, T)?;
    check(
        tx.iter().all(|c| c.status == WcStatus::Success),
        "atomics ok",
    )?;
    let mut word = [0u8; 8];
    ma.read(300_000, &mut word)?;
    check(
        u64::from_ne_bytes(word) == 40,
        "FETCH_ADD returns the old value",
    )?;
    ma.read(300_008, &mut word)?;
    check(
        u64::from_ne_bytes(word) == 42,
        "CMP_SWAP returns the old value",
    )?;
    mb.read(500_000, &mut word)?;
    check(u64::from_ne_bytes(word) == 7, "CMP_SWAP swapped")?;

    match a.stats() {
        Some(s) => println!(
            "all RC operations ok on {} -> {}; device a stats: {:?}",
            a.name(),
            b.name(),
            s.engine
        ),
        None => println!("all RC operations ok on {} -> {}", a.name(), b.name()),
    }
    Ok(())
}

/// The listed device called `name`; `soft`: a fresh soft device.
fn open_named(name: &str, k: usize) -> Result<Context> {
    if name == "soft" {
        return device_with(format!("roxe-example-{k}"), DeviceConfig::default()).open();
    }
    let Some(info) = devices()?.into_iter().find(|d| d.name() == name) else {
        return Err(Error::Verbs(VerbsError::new(
            "ibv_get_device_list",
            Errno(19),
            format!("no device {name}"),
        )));
    };
    info.open()
}

fn check(ok: bool, what: &str) -> Result<()> {
    if ok {
        println!("ok   {what}");
        Ok(())
    } else {
        eprintln!("FAIL {what}");
        std::process::exit(1)
    }
}
