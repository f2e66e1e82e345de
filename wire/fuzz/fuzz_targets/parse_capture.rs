//! Any bytes as a pcap/pcapng file: records are read without panics or
//! unbounded allocation, and every frame can be stripped to its L3 payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roxe_wire::pcap::{link_payload, CaptureReader};

fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = CaptureReader::new(data) {
        for rec in reader.take(1000) {
            match rec {
                Ok(r) => {
                    let _ = link_payload(r.link, &r.data);
                }
                Err(_) => break,
            }
        }
    }
});
