//! Any bytes, as a RoCEv2 UDP payload or as an IP datagram: the parser must
//! never panic, and whatever parses must re-emit to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roxe_wire::frame::Datagram;
use roxe_wire::{icrc, lint, Packet, PacketRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Packet::new_checked(data) {
        let _ = lint::lint(&p);
        if let Ok(r) = PacketRepr::parse(&p) {
            let mut out = vec![0u8; data.len()];
            let n = r.emit(&mut out).expect("a parsed packet must re-emit");
            assert_eq!(n, data.len());
            // Pad bytes are emitted as zero; everything else must match.
            let pad_start = n - 4 - p.pad_count() as usize;
            assert_eq!(&out[..pad_start], &data[..pad_start]);
        }
    }
    if let Ok(dg) = Datagram::parse(data) {
        let _ = dg.check_icrc();
    }
    let _ = icrc::check_datagram(data);
});
