//! Device memory through the Rust API: allocation limits, 4-byte aligned
//! copies in and out, a zero-based region over it that a peer WRITEs into,
//! and the memory outliving its handle while a region is registered.

mod common;

use common::open;
use roxe_verbs::*;
use std::time::Duration;

#[test]
fn device_memory_copies_regions_and_limits() {
    let (a, b) = (open("dm-a"), open("dm-b"));
    let max = roxe_provider_max();
    assert_eq!(b.alloc_dm(0, 0).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(b.alloc_dm(max + 1, 0).unwrap_err().errno(), libc::EINVAL);
    let dm = b.alloc_dm(4096, 6).unwrap();
    assert_eq!(dm.len(), 4096);
    // The device's device memory is shared by its buffers.
    assert_eq!(b.alloc_dm(max, 0).unwrap_err().errno(), libc::ENOMEM);
    dm.write(8, b"roxe dm!").unwrap();
    let mut back = [0u8; 8];
    dm.read(8, &mut back).unwrap();
    assert_eq!(&back, b"roxe dm!");
    for (off, len) in [(2u64, 4usize), (4, 3), (4096, 4), (0, 4100)] {
        assert_eq!(
            dm.write(off, &vec![0; len]).unwrap_err().errno(),
            libc::EINVAL,
            "{off}+{len}"
        );
        assert_eq!(
            dm.read(off, &mut vec![0; len]).unwrap_err().errno(),
            libc::EINVAL,
            "{off}+{len}"
        );
    }

    // A zero-based region over the second KiB, written by a peer.
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let zb = AccessFlags::ZERO_BASED | AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let errno = |r: Result<Mr>| r.err().map(|e| e.errno());
    assert_eq!(
        errno(pb.reg_dm_mr(&dm, 1024, 1024, AccessFlags::LOCAL_WRITE)),
        Some(libc::EINVAL),
        "device memory regions are zero-based"
    );
    assert_eq!(errno(pb.reg_dm_mr(&dm, 4000, 1024, zb)), Some(libc::EINVAL));
    let mr = pb.reg_dm_mr(&dm, 1024, 1024, zb).unwrap();
    assert!(dm.has_regions());
    let (ca, cb) = (a.create_cq(8, None).unwrap(), b.create_cq(8, None).unwrap());
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb)).unwrap();
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    qa.connect(1, &qb.endpoint(2), Mtu::Mtu1024, rights, 14)
        .unwrap();
    qb.connect(2, &qa.endpoint(1), Mtu::Mtu1024, rights, 14)
        .unwrap();
    let src = pa.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    src.write(0, &[0xd7; 64]).unwrap();
    let mut wr = SendWr::new(1, SendOpcode::RdmaWrite, vec![src.sge(0, 64)]);
    wr.remote_addr = 16; // zero-based: DM offset 1024 + 16
    wr.rkey = mr.rkey();
    qa.post_send(wr).unwrap();
    let wc = ca.poll_wait(1, Duration::from_secs(5)).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success);
    let mut got = [0u8; 64];
    dm.read(1040, &mut got).unwrap();
    assert_eq!(got, [0xd7; 64]);
    // The region keeps the memory alive after the handle goes.
    drop(dm);
    drop(mr);
}

fn roxe_provider_max() -> usize {
    roxe_verbs::MAX_DM_SIZE
}
