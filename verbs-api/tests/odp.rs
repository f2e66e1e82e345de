//! On-demand paging through the Rust API between two soft devices: a
//! WRITE and a READ through an ODP region over plain process memory, an
//! implicit region (the whole address space), and a page unmapped under
//! a registered region, which the peer sees as REM_ACCESS_ERR (never a
//! fault in this process); `advise_mr` checks its SGEs.

mod common;

use common::open;
use roxe_verbs::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

fn one(cq: &Cq) -> WorkCompletion {
    let wcs = cq.poll_wait(1, T).unwrap();
    assert_eq!(wcs.len(), 1, "one completion in time");
    wcs[0]
}

#[test]
fn odp_regions_over_plain_memory_and_unmapped_pages() {
    let (a, b) = (open("odp-a"), open("odp-b"));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (
        a.create_cq(16, None).unwrap(),
        b.create_cq(16, None).unwrap(),
    );
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb)).unwrap();
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    qa.connect(1, &qb.endpoint(2), Mtu::Mtu1024, rights, 14)
        .unwrap();
    qb.connect(2, &qa.endpoint(1), Mtu::Mtu1024, rights, 14)
        .unwrap();

    // a's source: an owned MR. b's target: three pages of an anonymous
    // mapping under an ODP region.
    let src = pa.reg_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    src.write(0, &[0x5a; 8192]).unwrap();
    // SAFETY: a fresh private anonymous mapping this test owns.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            3 * 4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let base = map as usize;
    let odp = pb.reg_mr_odp(base, 3 * 4096, base as u64, rights).unwrap();
    pb.advise_mr(&[odp.sge(0, 4096)]).unwrap();
    assert_eq!(
        pb.advise_mr(&[src_sge_of_other_pd()]).unwrap_err().errno(),
        libc::EINVAL
    );

    let write = |va: u64, rkey: u32, len: u32| {
        let mut wr = SendWr::new(1, SendOpcode::RdmaWrite, vec![src.sge(0, len)]);
        wr.remote_addr = va;
        wr.rkey = rkey;
        qa.post_send(wr).unwrap();
        one(&ca).status
    };
    assert_eq!(
        write(base as u64 + 100, odp.rkey(), 5000),
        WcStatus::Success
    );
    // SAFETY: bytes of the test's own mapping, written by the completed WRITE.
    let landed = unsafe { std::slice::from_raw_parts((base + 100) as *const u8, 5000) };
    assert!(landed.iter().all(|&b| b == 0x5a));
    let mut rd = SendWr::new(2, SendOpcode::RdmaRead, vec![src.sge(0, 64)]);
    rd.remote_addr = base as u64 + 4096;
    rd.rkey = odp.rkey();
    qa.post_send(rd).unwrap();
    assert_eq!(one(&ca).status, WcStatus::Success);

    // The middle page goes away under the region: the peer's WRITE there
    // is a remote access error, and this process does not fault.
    // SAFETY: the test's own mapping; nothing refers to that page.
    assert_eq!(
        unsafe { libc::munmap((base + 4096) as *mut libc::c_void, 4096) },
        0
    );
    assert_eq!(
        write(base as u64 + 4096, odp.rkey(), 64),
        WcStatus::RemAccessErr
    );
    drop(odp);
    // SAFETY: the rest of the test's mapping.
    unsafe {
        libc::munmap(map, 4096);
        libc::munmap((base + 8192) as *mut libc::c_void, 4096);
    }
}

/// An SGE no region of any PD holds.
fn src_sge_of_other_pd() -> Sge {
    Sge {
        addr: 0,
        length: 8,
        lkey: 0x7fff_ff01,
    }
}

#[test]
fn an_implicit_region_covers_the_address_space() {
    let (a, b) = (open("odp-c"), open("odp-d"));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (
        a.create_cq(16, None).unwrap(),
        b.create_cq(16, None).unwrap(),
    );
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb)).unwrap();
    let rights = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    qa.connect(1, &qb.endpoint(2), Mtu::Mtu1024, rights, 14)
        .unwrap();
    qb.connect(2, &qa.endpoint(1), Mtu::Mtu1024, rights, 14)
        .unwrap();
    let implicit = pb.reg_mr_odp(0, usize::MAX, 0, rights).unwrap();
    let target = vec![0u8; 2048].into_boxed_slice();
    let at = target.as_ptr() as u64;
    let src = pa.reg_mr(2048, AccessFlags::LOCAL_WRITE).unwrap();
    src.write(0, &[9; 2048]).unwrap();
    let mut wr = SendWr::new(1, SendOpcode::RdmaWrite, vec![src.sge(0, 2048)]);
    wr.remote_addr = at;
    wr.rkey = implicit.rkey();
    qa.post_send(wr).unwrap();
    assert_eq!(one(&ca).status, WcStatus::Success);
    // SAFETY: reading our own buffer after the WRITE completed (no Rust
    // reference to it existed while the device wrote).
    let got = unsafe { std::ptr::read_volatile(target.as_ptr().add(2047)) };
    assert_eq!(got, 9);
    drop(implicit);
}
