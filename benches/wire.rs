//! Wire-format throughput: the ICRC over 64 B, 1 KiB and 4 KiB packets, and
//! parse / emit rates in packets per second.
//!
//! Run: `cargo bench --bench wire` (figures go to docs/PERFORMANCE.md).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use roxe_wire::{icrc, BthRepr, ExtHeaders, Opcode, Packet, PacketRepr, Psn, RethRepr};
use std::hint::black_box;
use std::net::Ipv4Addr;

const SRC: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1); // testnet: allow (packet bytes only)
const DST: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2); // testnet: allow (packet bytes only)

fn write_only(payload: &[u8]) -> PacketRepr<'_> {
    PacketRepr {
        bth: BthRepr {
            ack_req: true,
            ..BthRepr::new(Opcode::RcWriteOnly, 0x11, Psn::new(1))
        },
        ext: ExtHeaders {
            reth: Some(RethRepr {
                va: 0x7f00_0000_0000,
                rkey: 0x1234,
                dma_len: payload.len() as u32,
            }),
            ..ExtHeaders::NONE
        },
        payload,
    }
}

/// A RoCEv2 UDP payload of exactly `len` bytes (headers, payload, ICRC).
fn packet_of_len(len: usize) -> Vec<u8> {
    let payload = vec![0xA5u8; len - 12 - 16 - 4];
    let r = write_only(&payload);
    let mut buf = vec![0u8; len];
    let n = r.emit_ipv4_linux(&mut buf, SRC, DST, 0xc000, 4791).unwrap();
    assert_eq!(n, len);
    buf
}

fn bench_icrc(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc");
    for len in [64usize, 1024, 4096] {
        let pkt = packet_of_len(len);
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new("compute_linux_ipv4", len), &pkt, |b, p| {
            b.iter(|| {
                icrc::compute_linux_ipv4(SRC, DST, 0xc000, 4791, black_box(&p[..len - 4])).unwrap()
            })
        });
        // What the engine does per packet: the headers' CRC kept per flow
        // and length (`Ipv4Prefixes`), the packet's own bytes hashed.
        let mut kept = icrc::Ipv4Prefixes::default();
        g.bench_with_input(BenchmarkId::new("kept_prefix", len), &pkt, |b, p| {
            b.iter(|| {
                kept.icrc(SRC, DST, 0xc000, 4791, &[black_box(&p[..len - 4])])
                    .unwrap()
            })
        });
        // Re-signing a GSO segment for its identification (what the
        // transmit batch does instead of a second CRC): one per run, then
        // one delta per segment (a few XORs from the per-bit table).
        let r = icrc::Reident::new(len - 4);
        g.bench_with_input(BenchmarkId::new("reident_delta", len), &r, |b, r| {
            b.iter(|| black_box(r).delta(0, black_box(7)))
        });
    }
    g.finish();
}

fn bench_parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse");
    g.throughput(Throughput::Elements(1));
    let small = packet_of_len(64);
    let ack = {
        let r = PacketRepr {
            bth: BthRepr::new(Opcode::RcAcknowledge, 0x11, Psn::new(1)),
            ext: ExtHeaders {
                aeth: Some(roxe_wire::AethRepr {
                    syndrome: roxe_wire::AethSyndrome::ACK,
                    msn: 1,
                }),
                ..ExtHeaders::NONE
            },
            payload: &[],
        };
        let mut b = vec![0u8; r.buffer_len()];
        r.emit(&mut b).unwrap();
        b
    };
    let big = packet_of_len(4096);
    let cases = [
        ("write_only_64B", &small),
        ("ack", &ack),
        ("write_only_4KiB", &big),
    ];
    // The zero-copy path the transport uses: check the structure once, then
    // read the fields it dispatches on.
    for (name, p) in cases {
        g.bench_function(format!("view_{name}"), |b| {
            b.iter(|| {
                let pkt = Packet::new_checked(black_box(&p[..])).unwrap();
                let bth = pkt.bth();
                (pkt.opcode(), bth.dest_qp(), bth.psn(), pkt.payload().len())
            })
        });
    }
    // Everything into a PacketRepr (all headers by value).
    for (name, p) in cases {
        g.bench_function(format!("repr_{name}"), |b| {
            b.iter(|| {
                let pkt = Packet::new_checked(black_box(&p[..])).unwrap();
                PacketRepr::parse(&pkt).unwrap()
            })
        });
    }
    g.finish();
}

fn bench_emit(c: &mut Criterion) {
    let mut g = c.benchmark_group("emit");
    g.throughput(Throughput::Elements(1));
    let payload = vec![0x5Au8; 32];
    let r = write_only(&payload);
    let mut buf = vec![0u8; 256];
    g.bench_function("write_only_64B", |b| {
        b.iter(|| black_box(&r).emit(&mut buf).unwrap())
    });
    g.bench_function("write_only_64B_with_icrc", |b| {
        b.iter(|| {
            black_box(&r)
                .emit_ipv4_linux(&mut buf, SRC, DST, 0xc000, 4791)
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench_icrc, bench_parse, bench_emit);
criterion_main!(benches);
