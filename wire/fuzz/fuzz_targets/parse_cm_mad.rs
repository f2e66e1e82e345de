//! Any bytes as a MAD (the UD payload to QP1): the CM parser must never
//! panic, whatever parses must re-emit to the same 256 bytes, and the CMA
//! header in a REQ's or SIDR_REQ's private data must parse without panics
//! and round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roxe_wire::cm::rdma_cm::{CmaHeader, CMA_HEADER_LEN};
use roxe_wire::cm::{CmMad, CmMessage, MAD_LEN};

fn cma(private_data: &[u8]) {
    if let Ok(h) = CmaHeader::parse(private_data) {
        let mut out = [0u8; CMA_HEADER_LEN];
        assert_eq!(h.emit(&mut out), Ok(CMA_HEADER_LEN));
        assert_eq!(CmaHeader::parse(&out), Ok(h));
    }
}

fuzz_target!(|data: &[u8]| {
    cma(data);
    if let Ok(m) = CmMad::parse(data) {
        let mut out = [0u8; MAD_LEN];
        assert_eq!(m.emit(&mut out), Ok(MAD_LEN), "a parsed MAD must re-emit");
        assert_eq!(&out[..], &data[..MAD_LEN]);
        assert_eq!(CmMad::parse(&out).as_ref(), Ok(&m));
        match &m.message {
            CmMessage::Req(r) => cma(&r.private_data),
            CmMessage::SidrReq(r) => cma(&r.private_data),
            _ => {}
        }
    }
});
