//! `open_at` (how rdma_cm finds the device of an address) from many
//! threads at once: one device per address per process, whatever the
//! interleaving. Two devices at one address in one process would be two
//! members of the address's shared group, each with its own QPNs and CM
//! IDs, and connections made through one would be unknown to the other.

use roxe_verbs::*;
use std::sync::Barrier;

#[test]
fn concurrent_opens_of_distinct_addresses_share_one_device_per_address() {
    const THREADS: usize = 12;
    let addrs: Vec<_> = (0..THREADS).map(|_| roxe_testnet::addr()).collect();
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        let handles: Vec<_> = addrs
            .iter()
            .map(|&a| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let first = open_at(a.into()).expect("open_at");
                    // Others open their addresses meanwhile.
                    barrier.wait();
                    let again = open_at(a.into()).expect("open_at again");
                    let (d1, d2) = (first.soft_device().unwrap(), again.soft_device().unwrap());
                    assert!(
                        std::ptr::eq(d1, d2),
                        "{a}: a second device opened at the address (names {} and {})",
                        first.name(),
                        again.name()
                    );
                    assert_eq!(first.name(), again.name());
                    first.name().to_owned()
                })
            })
            .collect();
        let mut names: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        names.sort();
        names.dedup();
        assert_eq!(
            names.len(),
            THREADS,
            "two addresses under one name: {names:?}"
        );
    });
}
