//! A region deregistered while a peer streams RDMA READs from it: READ
//! responses leave straight from registered memory (payloads by
//! reference), so this checks that none of them carries a byte of what the
//! memory held after `ibv_dereg_mr` returned (the freed buffer refilled),
//! and that the READs after it fail with a remote access error.

mod common;

use common::open;
use roxe_verbs::*;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);
/// Bytes per READ, and READs kept in flight (each into its own slot).
const SIZE: usize = 65536;
const SLOTS: usize = 32;
const OLD: u8 = 0xA5;
const NEW: u8 = 0x3C;

#[test]
fn no_read_response_carries_memory_from_after_its_deregistration() {
    let (a, b) = (open("dereg-reads-a"), open("dereg-reads-b"));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (
        a.create_cq(64, None).unwrap(),
        b.create_cq(256, None).unwrap(),
    );
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb, &cb)).unwrap();
    let source = pa
        .reg_mr(SIZE, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    source.write(0, &[OLD; SIZE]).unwrap();
    let sink = pb.reg_mr(SIZE * SLOTS, AccessFlags::LOCAL_WRITE).unwrap();
    let access = AccessFlags::REMOTE_READ;
    qa.connect(1, &qb.endpoint(2), Mtu::Mtu4096, access, 14)
        .unwrap();
    qb.connect(2, &qa.endpoint(1), Mtu::Mtu4096, access, 14)
        .unwrap();
    // More READs in flight than the responder's READ resources allow is
    // fine: the requester queues them (max_rd_atomic).
    let (remote_addr, rkey) = (source.addr(), source.rkey());
    let read = |slot: usize, wr_id: u64| {
        let mut wr = SendWr::new(
            wr_id,
            SendOpcode::RdmaRead,
            vec![sink.sge(slot * SIZE, SIZE as u32)],
        );
        wr.remote_addr = remote_addr;
        wr.rkey = rkey;
        wr.flags = SendFlags::SIGNALED;
        wr
    };
    for slot in 0..SLOTS {
        sink.write(slot * SIZE, &[0; SIZE]).unwrap();
        qb.post_send(read(slot, slot as u64)).unwrap();
    }
    let mut source = Some(source);
    let mut refill: Vec<Vec<u8>> = Vec::new();
    let (mut ok_before, mut ok_after, mut failed) = (0u64, 0u64, None);
    let mut next = SLOTS as u64;
    let mut wcs = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); 16];
    let mut slot_data = vec![0u8; SIZE];
    let give_up = Instant::now() + T;
    while failed.is_none() && Instant::now() < give_up {
        let n = cb.poll(&mut wcs).unwrap();
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                failed.get_or_insert(wc.status);
                continue;
            }
            let slot = (wc.wr_id as usize) % SLOTS;
            sink.read(slot * SIZE, &mut slot_data).unwrap();
            assert!(
                slot_data.iter().all(|&x| x == OLD),
                "READ {} carried bytes other than the region's ({:#x} at {:?})",
                wc.wr_id,
                slot_data.iter().find(|&&x| x != OLD).copied().unwrap_or(0),
                slot_data.iter().position(|&x| x != OLD)
            );
            if source.is_some() {
                ok_before += 1;
            } else {
                ok_after += 1;
            }
            sink.write(slot * SIZE, &[0; SIZE]).unwrap();
            if failed.is_none() {
                // After deregistration the old key, which must fail; the
                // QP may already be in error (the post is then refused).
                let _ = qb.post_send(read(slot, next));
                next += 1;
            }
        }
        if ok_before >= 200 && source.is_some() {
            // Deregister with READs in flight, then let the allocator hand
            // the freed buffer out again, refilled.
            drop(source.take());
            for _ in 0..64 {
                refill.push(vec![NEW; SIZE]);
            }
        }
    }
    println!(
        "READs completed before deregistration {ok_before}, after {ok_after}, then {failed:?}"
    );
    assert!(
        ok_before >= 200,
        "the READ stream did not run ({ok_before} completed)"
    );
    assert_eq!(
        failed,
        Some(WcStatus::RemAccessErr),
        "READs after deregistration must fail with a remote access error"
    );
    // Keep the refill alive to the end (it is what a stale send would read).
    assert!(refill.iter().all(|v| v[0] == NEW));
}
