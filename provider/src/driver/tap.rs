//! The pcap tap (`ROXE_PCAP=FILE`; `%p` in FILE becomes the process id, so
//! processes that share the setting, as MPI ranks do, write a file each):
//! every RoCEv2 packet sent and received,
//! written with IP and UDP headers as Linux puts them on the wire for roxe
//! (IPv4: identification 0, don't-fragment, TTL 64), so Wireshark,
//! `roxe decode` and roce-check verify the ICRCs.
//!
//! A UDP socket does not show a received packet's IP header; received
//! packets are written with the same reconstructed header, which is exact
//! for roxe peers. From rxe or a NIC (non-zero IPv4 identification) their
//! ICRC will not verify in the capture, though it did on the wire.

use roxe_wire::ip::{Ipv4Repr, Ipv6Repr, UdpRepr, IPV4_HEADER_LEN, IPV6_HEADER_LEN};
use roxe_wire::pcap::PcapWriter;
use std::fs::File;
use std::io::{self, BufWriter};
use std::net::IpAddr;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Flush the file after this many packets so a crash loses little.
const FLUSH_EVERY: u32 = 64;

pub(crate) struct Tap {
    writer: PcapWriter<BufWriter<File>>,
    scratch: Vec<u8>,
    unflushed: u32,
    errors: u64,
}

impl Tap {
    pub(crate) fn create(path: &Path) -> io::Result<Tap> {
        let expanded = path
            .to_string_lossy()
            .replace("%p", &std::process::id().to_string());
        let path = Path::new(&expanded);
        let named = |e: &dyn std::fmt::Display| {
            io::Error::other(format!("ROXE_PCAP {}: {e}", path.display()))
        };
        let file = std::fs::File::create(path).map_err(|e| named(&e))?;
        let writer =
            roxe_wire::pcap::PcapWriter::new(io::BufWriter::new(file)).map_err(|e| named(&e))?;
        Ok(Tap {
            writer,
            scratch: Vec::with_capacity(9000),
            unflushed: 0,
            errors: 0,
        })
    }

    /// Append one UDP payload (BTH .. ICRC) as an IP datagram (IPv4
    /// identification 0).
    pub(crate) fn write(
        &mut self,
        src: IpAddr,
        src_port: u16,
        dst: IpAddr,
        dst_port: u16,
        payload: &[u8],
    ) {
        self.write_ident(src, src_port, dst, dst_port, 0, payload);
    }

    /// [`write`](Self::write) with IPv4 identification `ident` (a GSO
    /// segment's).
    pub(crate) fn write_ident(
        &mut self,
        src: IpAddr,
        src_port: u16,
        dst: IpAddr,
        dst_port: u16,
        ident: u16,
        payload: &[u8],
    ) {
        let udp_len = 8 + payload.len();
        let ip_len = match src {
            IpAddr::V4(_) => IPV4_HEADER_LEN,
            IpAddr::V6(_) => IPV6_HEADER_LEN,
        };
        self.scratch.clear();
        self.scratch.resize(ip_len + udp_len, 0);
        let ok = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Ipv4Repr {
                src: s,
                dst: d,
                tos: 0,
                ident,
                dont_frag: true,
                ttl: 64,
                payload_len: udp_len,
            }
            .emit(&mut self.scratch)
            .is_ok(),
            (IpAddr::V6(s), IpAddr::V6(d)) => Ipv6Repr {
                src: s,
                dst: d,
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 64,
                payload_len: udp_len,
            }
            .emit(&mut self.scratch)
            .is_ok(),
            _ => false,
        };
        let ok = ok
            && UdpRepr {
                src_port,
                dst_port,
                payload_len: payload.len(),
            }
            .emit(&mut self.scratch[ip_len..])
            .is_ok();
        if !ok {
            self.errors += 1;
            return;
        }
        self.scratch[ip_len + 8..].copy_from_slice(payload);
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        if self.writer.write_ip(ts, &self.scratch).is_err() {
            self.errors += 1;
        }
        self.unflushed += 1;
        if self.unflushed >= FLUSH_EVERY {
            self.flush();
        }
    }

    /// Flush if packets were written since the last flush.
    pub(crate) fn flush_pending(&mut self) {
        if self.unflushed > 0 {
            self.flush();
        }
    }

    pub(crate) fn flush(&mut self) {
        self.unflushed = 0;
        if self.writer.flush().is_err() {
            self.errors += 1;
        }
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.flush();
    }
}
