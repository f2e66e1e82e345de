//! Property tests: random valid representations round-trip
//! emit → parse → emit, with a verifying ICRC; random bytes never panic
//! (as packets, datagrams and CM MADs).

use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use roxe_wire::aeth::AethSyndrome;
use roxe_wire::cm::{self, rdma_cm::CmaHeader, CmMad};
use roxe_wire::frame::{build_datagram, Datagram, IpFields};
use roxe_wire::opcode::{HeaderSet, PacketClass};
use roxe_wire::{
    lint, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, ExtHeaders, FethRepr,
    Opcode, Packet, PacketRepr, Psn, RethRepr, VALID_PMTUS,
};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fn opcode() -> impl Strategy<Value = Opcode> {
    prop::sample::select(Opcode::ALL.to_vec())
}

fn syndrome() -> impl Strategy<Value = AethSyndrome> {
    any::<u8>().prop_filter_map("reserved syndrome", |b| AethSyndrome::from_byte(b).ok())
}

fn bth(op: Opcode) -> impl Strategy<Value = BthRepr> {
    (
        any::<(bool, bool, bool, bool, bool)>(),
        any::<u16>(),
        0u8..64,
        0u32..1 << 24,
        0u8..128,
        any::<u32>(),
    )
        .prop_map(
            move |((se, m, f, b, a), pkey, resv6, qp, resv7, psn)| BthRepr {
                opcode: op,
                solicited: se,
                migreq: m,
                pkey,
                fecn: f,
                becn: b,
                resv6,
                dest_qp: qp,
                ack_req: a,
                resv7,
                psn: Psn::new(psn),
            },
        )
}

fn ext(op: Opcode) -> impl Strategy<Value = ExtHeaders> {
    let set = op.headers();
    let opt = move |h: HeaderSet| set.contains(h);
    (
        any::<(u32, u32, u8)>(),
        any::<u32>(),
        any::<(u64, u32, u32)>(),
        any::<(u64, u32, u64, u64)>(),
        (syndrome(), 0u32..1 << 24),
        any::<(u64, u32, u32, [u8; 16])>(),
        any::<u32>(),
    )
        .prop_map(
            move |(d, feth, r, a, (syn, msn), (orig, imm, ieth, cnp), xrceth)| ExtHeaders {
                deth: opt(HeaderSet::DETH).then_some(DethRepr {
                    qkey: d.0,
                    src_qp: d.1 & 0xFF_FFFF,
                    reserved: d.2,
                }),
                feth: opt(HeaderSet::FETH).then_some(FethRepr { raw: feth }),
                reth: opt(HeaderSet::RETH).then_some(RethRepr {
                    va: r.0,
                    rkey: r.1,
                    dma_len: r.2,
                }),
                atomic_eth: opt(HeaderSet::ATOMIC_ETH).then_some(AtomicEthRepr {
                    va: a.0,
                    rkey: a.1,
                    swap_add: a.2,
                    compare: a.3,
                }),
                aeth: opt(HeaderSet::AETH).then_some(AethRepr { syndrome: syn, msn }),
                atomic_ack_eth: opt(HeaderSet::ATOMIC_ACK_ETH).then_some(AtomicAckEthRepr { orig }),
                imm_dt: opt(HeaderSet::IMM_DT).then_some(imm),
                ieth: opt(HeaderSet::IETH).then_some(ieth),
                cnp_reserved: opt(HeaderSet::CNP_PAD).then_some(cnp),
                xrceth: opt(HeaderSet::XRC_ETH).then_some(xrceth),
            },
        )
}

fn payload_len(op: Opcode) -> BoxedStrategy<usize> {
    match op.class() {
        PacketClass::First | PacketClass::Middle => {
            prop::sample::select(VALID_PMTUS.to_vec()).boxed()
        }
        PacketClass::Last => (1usize..=4096).boxed(),
        PacketClass::Only => (0usize..=4096).boxed(),
        PacketClass::Atomic8 => Just(8).boxed(),
        PacketClass::NoPayload | PacketClass::Cnp => Just(0).boxed(),
    }
}

/// A random valid packet: (BTH, extension headers, payload bytes).
fn packet() -> impl Strategy<Value = (BthRepr, ExtHeaders, Vec<u8>)> {
    opcode().prop_flat_map(|op| {
        (
            bth(op),
            ext(op),
            payload_len(op).prop_flat_map(|n| prop::collection::vec(any::<u8>(), n)),
        )
    })
}

/// Deterministic by default: a fixed seed unless `PROPTEST_RNG_SEED` names
/// another; the seed is printed so any failure can be replayed.
fn config() -> ProptestConfig {
    let mut c = ProptestConfig {
        cases: 2048,
        ..ProptestConfig::default()
    };
    if matches!(c.rng_seed, RngSeed::Random) {
        c.rng_seed = RngSeed::Fixed(0x726f_7865);
    }
    eprintln!(
        "proptest seed {:?} (replay or vary with PROPTEST_RNG_SEED=N)",
        c.rng_seed
    );
    c
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn emit_parse_emit_round_trips((b, e, payload) in packet()) {
        let repr = PacketRepr { bth: b, ext: e, payload: &payload };
        let mut buf = vec![0u8; repr.buffer_len()];
        let n = repr.emit(&mut buf).unwrap();
        prop_assert_eq!(n, buf.len());
        prop_assert_eq!(n % 4, 0);
        let p = Packet::new_checked(&buf[..]).unwrap();
        let parsed = PacketRepr::parse(&p).unwrap();
        prop_assert_eq!(parsed, repr);
        // The zero-copy accessors agree with the full parse.
        prop_assert_eq!(p.reth(), repr.ext.reth);
        prop_assert_eq!(p.aeth(), repr.ext.aeth);
        prop_assert_eq!(p.atomic_eth(), repr.ext.atomic_eth);
        prop_assert_eq!(p.atomic_ack_eth(), repr.ext.atomic_ack_eth);
        prop_assert_eq!(p.deth(), repr.ext.deth);
        prop_assert_eq!(p.imm_dt(), repr.ext.imm_dt);
        prop_assert_eq!(p.ieth(), repr.ext.ieth);
        prop_assert_eq!(p.payload(), &payload[..]);
        let mut again = vec![0u8; n];
        parsed.emit(&mut again).unwrap();
        prop_assert_eq!(again, buf);
    }

    #[test]
    fn emitted_datagrams_carry_a_verifying_icrc(
        (b, e, payload) in packet(),
        v6 in any::<bool>(),
        ident in any::<u16>(),
        tos in any::<u8>(),
        ttl in any::<u8>(),
        sport in any::<u16>(),
    ) {
        let repr = PacketRepr { bth: b, ext: e, payload: &payload };
        let (src, dst) = if v6 {
            (IpAddr::V6(Ipv6Addr::LOCALHOST), IpAddr::V6("fd00::9".parse().unwrap())) // testnet: allow (packet bytes only)
        } else {
            (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(127, 3, 2, 1))) // testnet: allow (packet bytes only)
        };
        let fields = IpFields { ipv4_ident: ident, tos, ttl, flow_label: u32::from(ident) };
        let mut buf = vec![0u8; 9000];
        let n = build_datagram(&mut buf, src, dst, sport, 4791, fields, &repr).unwrap();
        let dg = Datagram::parse(&buf[..n]).unwrap();
        prop_assert!(dg.check_icrc().unwrap().unwrap().ok());
        prop_assert_eq!(PacketRepr::parse_bytes(dg.payload).unwrap(), repr);
        // Flipping one covered bit of the BTH-to-pad range (other than
        // BTH byte 4, which the ICRC masks) breaks the ICRC.
        let ip_len = dg.ip_header.len();
        let covered = n - ip_len - 8 - 4;
        let off = usize::from(ident) % covered;
        if off != 4 {
            buf[ip_len + 8 + off] ^= 0x01;
            let dg = Datagram::parse(&buf[..n]).unwrap();
            prop_assert!(!dg.check_icrc().unwrap().unwrap().ok());
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(p) = Packet::new_checked(&bytes[..]) {
            let _ = lint::lint(&p);
            let _ = PacketRepr::parse(&p);
        }
        let _ = Datagram::parse(&bytes).map(|d| d.check_icrc());
        let _ = roxe_wire::icrc::check_datagram(&bytes);
    }

    #[test]
    fn mutated_valid_packets_never_panic(
        (b, e, payload) in packet(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let repr = PacketRepr { bth: b, ext: e, payload: &payload };
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf).unwrap();
        for (i, x) in flips {
            let i = i.index(buf.len());
            buf[i] ^= x;
        }
        let end = cut.index(buf.len() + 1);
        if let Ok(p) = Packet::new_checked(&buf[..end]) {
            let _ = lint::lint(&p);
            if let Ok(r) = PacketRepr::parse(&p) {
                let mut out = vec![0u8; end];
                prop_assert_eq!(r.emit(&mut out).unwrap(), end);
            }
        }
    }

    /// Any bytes as a MAD: the CM parser never panics; a CM MAD (base
    /// version 1, class 0x07) of at least 256 bytes always parses, keeps
    /// every bit (re-emits the same 256 bytes) and parses back the same.
    #[test]
    fn cm_mad_parse_never_panics_and_keeps_every_bit(
        mut bytes in prop::collection::vec(any::<u8>(), 0..300),
        cm_like in any::<bool>(),
        attr_id in 0u16..0x20,
    ) {
        if cm_like && bytes.len() >= 18 {
            bytes[0] = cm::MAD_BASE_VERSION;
            bytes[1] = cm::MGMT_CLASS_CM;
            bytes[16..18].copy_from_slice(&attr_id.to_be_bytes());
        }
        let is_cm = bytes.len() >= cm::MAD_LEN && bytes[0] == 1 && bytes[1] == cm::MGMT_CLASS_CM;
        match CmMad::parse(&bytes) {
            Ok(m) => {
                prop_assert!(is_cm);
                let mut out = [0u8; cm::MAD_LEN];
                prop_assert_eq!(m.emit(&mut out), Ok(cm::MAD_LEN));
                prop_assert_eq!(&out[..], &bytes[..cm::MAD_LEN]);
                prop_assert_eq!(CmMad::parse(&out), Ok(m));
            }
            Err(_) => prop_assert!(!is_cm),
        }
        if let Ok(h) = CmaHeader::parse(&bytes) {
            let mut out = [0u8; 36];
            prop_assert_eq!(h.emit(&mut out), Ok(36));
            prop_assert_eq!(CmaHeader::parse(&out), Ok(h));
        }
    }
}
