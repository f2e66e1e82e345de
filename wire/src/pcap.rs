//! Capture files: reading classic pcap and pcapng, writing classic pcap, and
//! stripping the link-layer header off a captured frame.
//!
//! [`CaptureReader`] reads classic pcap (microsecond and nanosecond magic, both
//! byte orders, and the "modified" Kuznetzov variant) and pcapng (any number of
//! sections and interfaces; Enhanced, Simple and the obsolete Packet blocks;
//! the `if_tsresol` and `if_tsoffset` options). It is written for hostile
//! input: every length is checked before use, a record may hold at most
//! [`MAX_RECORD_LEN`] bytes and a pcapng block at most [`MAX_BLOCK_LEN`]
//! bytes, buffers grow only as data actually arrives, and a malformed file
//! ends the iteration with an error instead of a panic.
//!
//! [`link_payload`] finds the network-layer datagram inside a frame of any
//! supported link type, and [`PcapWriter`] writes nanosecond classic pcap with
//! Ethernet framing that Wireshark, tshark and tcpdump read.
//!
//! Like the rest of the crate this does no I/O of its own: readers and
//! writers work over any `Read`/`Write`, and opening files is the
//! caller's business.

use std::fmt;
use std::io::{self, Read, Write};

/// The largest captured length of one record the reader accepts (16 MiB).
pub const MAX_RECORD_LEN: u32 = 16 * 1024 * 1024;
/// The largest pcapng block the reader accepts (32 MiB).
pub const MAX_BLOCK_LEN: u32 = 32 * 1024 * 1024;
/// The most interfaces one pcapng section may describe.
pub const MAX_INTERFACES: usize = 65_536;
/// The snapshot length [`PcapWriter`] declares, and the longest frame it writes.
pub const WRITER_SNAPLEN: u32 = 262_144;

/// Destination MAC address [`PcapWriter::write_ip`] puts into its frames.
pub const WRITER_DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
/// Source MAC address [`PcapWriter::write_ip`] puts into its frames.
pub const WRITER_SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];

/// Ethertype of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// Ethertype of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86DD;
/// Ethertype of RoCEv1 (InfiniBand GRH directly over Ethernet).
pub const ETHERTYPE_ROCEV1: u16 = 0x8915;
/// Tag protocol identifiers treated as VLAN tags (802.1Q, 802.1ad and the two
/// pre-standard QinQ values).
pub const VLAN_TPIDS: [u16; 4] = [0x8100, 0x88A8, 0x9100, 0x9200];

const LINKTYPE_NULL: u32 = 0;
const LINKTYPE_ETHERNET: u32 = 1;
const LINKTYPE_RAW: u32 = 101;
const LINKTYPE_LOOP: u32 = 108;
const LINKTYPE_LINUX_SLL: u32 = 113;
const LINKTYPE_IPV4: u32 = 228;
const LINKTYPE_IPV6: u32 = 229;
const LINKTYPE_LINUX_SLL2: u32 = 276;

const PCAPNG_SHB: [u8; 4] = [0x0A, 0x0D, 0x0D, 0x0A];
const PCAPNG_BOM: u32 = 0x1A2B_3C4D;
const PCAPNG_IDB: u32 = 1;
const PCAPNG_PB: u32 = 2;
const PCAPNG_SPB: u32 = 3;
const PCAPNG_EPB: u32 = 6;
const OPT_END: u16 = 0;
const OPT_IF_TSRESOL: u16 = 9;
const OPT_IF_TSOFFSET: u16 = 14;

const NS_PER_SEC: u64 = 1_000_000_000;

/// Link-layer type of a capture (the pcap `LINKTYPE_` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkType {
    /// `LINKTYPE_ETHERNET` (1).
    Ethernet,
    /// `LINKTYPE_LINUX_SLL` (113), Linux "cooked" capture v1.
    LinuxSll,
    /// `LINKTYPE_LINUX_SLL2` (276), Linux "cooked" capture v2.
    LinuxSll2,
    /// `LINKTYPE_RAW` (101; also the historical DLT values 12 and 14): raw IP,
    /// version in the first nibble.
    RawIp,
    /// `LINKTYPE_IPV4` (228): raw IPv4.
    Ipv4,
    /// `LINKTYPE_IPV6` (229): raw IPv6.
    Ipv6,
    /// `LINKTYPE_NULL` (0): BSD loopback, a 4-byte address family in the
    /// capturing host's byte order.
    Null,
    /// `LINKTYPE_LOOP` (108): OpenBSD loopback, a 4-byte address family in
    /// network byte order.
    Loop,
    /// Any other link type, by its `LINKTYPE_` value.
    Other(u32),
}

impl LinkType {
    /// The link type for a `LINKTYPE_` value.
    pub fn from_linktype(v: u32) -> Self {
        match v {
            LINKTYPE_NULL => Self::Null,
            LINKTYPE_ETHERNET => Self::Ethernet,
            12 | 14 | LINKTYPE_RAW => Self::RawIp,
            LINKTYPE_LOOP => Self::Loop,
            LINKTYPE_LINUX_SLL => Self::LinuxSll,
            LINKTYPE_IPV4 => Self::Ipv4,
            LINKTYPE_IPV6 => Self::Ipv6,
            LINKTYPE_LINUX_SLL2 => Self::LinuxSll2,
            other => Self::Other(other),
        }
    }

    /// The `LINKTYPE_` value (raw IP maps to 101).
    pub fn to_linktype(self) -> u32 {
        match self {
            Self::Null => LINKTYPE_NULL,
            Self::Ethernet => LINKTYPE_ETHERNET,
            Self::RawIp => LINKTYPE_RAW,
            Self::Loop => LINKTYPE_LOOP,
            Self::LinuxSll => LINKTYPE_LINUX_SLL,
            Self::Ipv4 => LINKTYPE_IPV4,
            Self::Ipv6 => LINKTYPE_IPV6,
            Self::LinuxSll2 => LINKTYPE_LINUX_SLL2,
            Self::Other(v) => v,
        }
    }
}

impl fmt::Display for LinkType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ethernet => f.write_str("ETHERNET"),
            Self::LinuxSll => f.write_str("LINUX_SLL"),
            Self::LinuxSll2 => f.write_str("LINUX_SLL2"),
            Self::RawIp => f.write_str("RAW"),
            Self::Ipv4 => f.write_str("IPV4"),
            Self::Ipv6 => f.write_str("IPV6"),
            Self::Null => f.write_str("NULL"),
            Self::Loop => f.write_str("LOOP"),
            Self::Other(v) => write!(f, "LINKTYPE_{v}"),
        }
    }
}

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureRecord {
    /// 1-based index of the frame in the file (counted across pcapng sections).
    pub frame: u64,
    /// Capture time in nanoseconds since the Unix epoch (0 for pcapng Simple
    /// Packet Blocks, which carry no timestamp).
    pub ts_ns: u64,
    /// Link-layer type of `data`.
    pub link: LinkType,
    /// The captured bytes (possibly cut by the capture's snapshot length).
    pub data: Vec<u8>,
    /// Length of the frame on the wire.
    pub orig_len: u32,
}

impl CaptureRecord {
    /// Whether the capture holds fewer bytes than were on the wire.
    pub fn is_truncated(&self) -> bool {
        u32::try_from(self.data.len()).map_or(true, |n| n < self.orig_len)
    }
}

/// Errors from reading or writing capture files.
#[derive(Debug, thiserror::Error)]
pub enum PcapError {
    /// The underlying reader or writer failed.
    #[error("capture I/O error: {0}")]
    Io(#[from] io::Error),
    /// The input does not start like a pcap or pcapng file.
    #[error("not a pcap or pcapng file ({})", describe_magic(.magic))]
    NotACapture {
        /// The first (up to four) bytes of the input.
        magic: Vec<u8>,
    },
    /// The file is a capture but its contents are inconsistent or truncated.
    #[error("malformed capture file: {0}")]
    Malformed(String),
    /// A value handed to [`PcapWriter`] cannot be written.
    #[error("invalid input for capture file: {0}")]
    InvalidInput(String),
}

fn describe_magic(magic: &[u8]) -> String {
    if magic.is_empty() {
        return "input is empty".to_string();
    }
    let hex: Vec<String> = magic.iter().map(|b| format!("{b:02x}")).collect();
    if magic.starts_with(&[0x1F, 0x8B]) {
        return format!(
            "starts with {}: gzip-compressed, decompress it first",
            hex.join(" ")
        );
    }
    if magic.len() < 4 {
        return format!("only {} byte(s): {}", magic.len(), hex.join(" "));
    }
    format!("magic number {}", hex.join(" "))
}

fn malformed(msg: impl Into<String>) -> PcapError {
    PcapError::Malformed(msg.into())
}

/// The container format of a capture file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureFormat {
    /// Classic libpcap format.
    Pcap,
    /// pcapng.
    PcapNg,
}

/// pcapng timestamp resolution: units of 10^-n or 2^-n seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TsResol {
    Decimal(u8),
    Binary(u8),
}

#[derive(Debug, Clone, Copy)]
struct Interface {
    link: LinkType,
    snaplen: u32,
    resol: TsResol,
    offset_s: i64,
}

#[derive(Debug)]
enum State {
    Pcap {
        big_endian: bool,
        nano: bool,
        /// Kuznetzov's modified format: 8 more bytes per record header.
        modified: bool,
        link: LinkType,
    },
    PcapNg {
        big_endian: bool,
        interfaces: Vec<Interface>,
    },
}

/// Reads classic pcap (µs and ns magic, both byte orders) and pcapng (any
/// number of sections and interfaces, EPB, SPB and PB blocks, `if_tsresol` and
/// `if_tsoffset`) and yields one [`CaptureRecord`] per captured frame.
///
/// Compressed files are not supported. After the first error the iterator
/// ends (returns `None`), since the position in the stream is then unknown.
#[derive(Debug)]
pub struct CaptureReader<R: Read> {
    reader: R,
    state: State,
    frame: u64,
    done: bool,
}

impl<R: Read> CaptureReader<R> {
    /// Read the file header (classic pcap) or the first Section Header Block
    /// (pcapng) and prepare to yield records.
    pub fn new(mut reader: R) -> Result<Self, PcapError> {
        let mut magic = [0u8; 4];
        let n = read_up_to(&mut reader, &mut magic)?;
        if n < 4 {
            return Err(PcapError::NotACapture {
                magic: magic[..n].to_vec(),
            });
        }
        let pcap = |big_endian, nano, modified| (big_endian, nano, modified);
        let classic = match magic {
            PCAPNG_SHB => None,
            [0xD4, 0xC3, 0xB2, 0xA1] => Some(pcap(false, false, false)),
            [0xA1, 0xB2, 0xC3, 0xD4] => Some(pcap(true, false, false)),
            [0x4D, 0x3C, 0xB2, 0xA1] => Some(pcap(false, true, false)),
            [0xA1, 0xB2, 0x3C, 0x4D] => Some(pcap(true, true, false)),
            [0x34, 0xCD, 0xB2, 0xA1] => Some(pcap(false, false, true)),
            [0xA1, 0xB2, 0xCD, 0x34] => Some(pcap(true, false, true)),
            _ => {
                return Err(PcapError::NotACapture {
                    magic: magic.to_vec(),
                })
            }
        };
        let state = match classic {
            Some((big_endian, nano, modified)) => {
                let mut hdr = [0u8; 20];
                if read_up_to(&mut reader, &mut hdr)? < hdr.len() {
                    return Err(malformed("truncated pcap file header"));
                }
                let major = get_u16(&hdr, 0, big_endian).unwrap_or(0);
                if major != 2 {
                    return Err(malformed(format!("unsupported pcap version {major}")));
                }
                // The low 16 bits hold the link type; the upper bits carry
                // FCS information that does not concern us.
                let network = get_u32(&hdr, 16, big_endian).unwrap_or(0);
                State::Pcap {
                    big_endian,
                    nano,
                    modified,
                    link: LinkType::from_linktype(network & 0xFFFF),
                }
            }
            None => {
                let mut state = State::PcapNg {
                    big_endian: false,
                    interfaces: Vec::new(),
                };
                read_section_header(&mut reader, &mut state)?;
                state
            }
        };
        Ok(Self {
            reader,
            state,
            frame: 0,
            done: false,
        })
    }

    /// Whether the file is classic pcap or pcapng.
    pub fn format(&self) -> CaptureFormat {
        match self.state {
            State::Pcap { .. } => CaptureFormat::Pcap,
            State::PcapNg { .. } => CaptureFormat::PcapNg,
        }
    }

    /// The link type of a classic pcap file, or of the first interface of the
    /// current pcapng section (`None` if it has described no interface yet).
    pub fn link_type(&self) -> Option<LinkType> {
        match &self.state {
            State::Pcap { link, .. } => Some(*link),
            State::PcapNg { interfaces, .. } => interfaces.first().map(|i| i.link),
        }
    }

    /// Number of records yielded so far.
    pub fn frames_read(&self) -> u64 {
        self.frame
    }

    /// Give back the underlying reader.
    pub fn into_inner(self) -> R {
        self.reader
    }

    fn read_record(&mut self) -> Result<Option<CaptureRecord>, PcapError> {
        let next = self.frame.saturating_add(1);
        let rec = match &mut self.state {
            State::Pcap {
                big_endian,
                nano,
                modified,
                link,
            } => read_pcap_record(&mut self.reader, *big_endian, *nano, *modified, *link, next)?,
            State::PcapNg { .. } => read_pcapng_record(&mut self.reader, &mut self.state, next)?,
        };
        if rec.is_some() {
            self.frame = next;
        }
        Ok(rec)
    }
}

impl<R: Read> Iterator for CaptureReader<R> {
    type Item = Result<CaptureRecord, PcapError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.read_record() {
            Ok(Some(rec)) => Some(Ok(rec)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

impl<R: Read> std::iter::FusedIterator for CaptureReader<R> {}

fn read_pcap_record<R: Read>(
    reader: &mut R,
    big_endian: bool,
    nano: bool,
    modified: bool,
    link: LinkType,
    frame: u64,
) -> Result<Option<CaptureRecord>, PcapError> {
    let mut hdr = [0u8; 24];
    let hlen = if modified { 24 } else { 16 };
    let hdr = &mut hdr[..hlen];
    let n = read_up_to(reader, hdr)?;
    if n == 0 {
        return Ok(None);
    }
    if n < hlen {
        return Err(malformed(format!(
            "truncated pcap record header of frame {frame}"
        )));
    }
    let field = |off| get_u32(hdr, off, big_endian).unwrap_or(0);
    let (sec, frac, incl, orig) = (field(0), field(4), field(8), field(12));
    if incl > MAX_RECORD_LEN {
        return Err(malformed(format!(
            "frame {frame} claims a captured length of {incl} bytes \
             (limit {MAX_RECORD_LEN})"
        )));
    }
    let data = read_vec(reader, incl)?
        .ok_or_else(|| malformed(format!("truncated pcap record data in frame {frame}")))?;
    let frac_ns = if nano {
        u64::from(frac)
    } else {
        u64::from(frac) * 1_000
    };
    Ok(Some(CaptureRecord {
        frame,
        ts_ns: u64::from(sec)
            .saturating_mul(NS_PER_SEC)
            .saturating_add(frac_ns),
        link,
        data,
        orig_len: orig,
    }))
}

/// Read the rest of a Section Header Block whose 4-byte type has been read.
fn read_section_header<R: Read>(reader: &mut R, state: &mut State) -> Result<(), PcapError> {
    let mut hdr = [0u8; 8];
    if read_up_to(reader, &mut hdr)? < hdr.len() {
        return Err(malformed("truncated pcapng section header block"));
    }
    let big_endian = match get_u32(&hdr, 4, false) {
        Some(PCAPNG_BOM) => false,
        Some(v) if v.swap_bytes() == PCAPNG_BOM => true,
        _ => return Err(malformed("bad pcapng byte-order magic")),
    };
    let blen = get_u32(&hdr, 0, big_endian).unwrap_or(0);
    if !(28..=MAX_BLOCK_LEN).contains(&blen) || blen & 3 != 0 {
        return Err(malformed(format!(
            "bad pcapng section header block length {blen}"
        )));
    }
    // Type, length and byte-order magic are read; the trailing length is
    // checked separately.
    let body = read_vec(reader, blen - 16)?
        .ok_or_else(|| malformed("truncated pcapng section header block"))?;
    check_trailer(reader, blen, big_endian)?;
    let major = get_u16(&body, 0, big_endian).unwrap_or(0);
    if major != 1 {
        return Err(malformed(format!("unsupported pcapng version {major}")));
    }
    *state = State::PcapNg {
        big_endian,
        interfaces: Vec::new(),
    };
    Ok(())
}

fn check_trailer<R: Read>(reader: &mut R, blen: u32, big_endian: bool) -> Result<(), PcapError> {
    let mut t = [0u8; 4];
    if read_up_to(reader, &mut t)? < t.len() {
        return Err(malformed("truncated pcapng block trailer"));
    }
    let trailer = get_u32(&t, 0, big_endian).unwrap_or(0);
    if trailer != blen {
        return Err(malformed(format!(
            "pcapng block length {blen} does not match its trailing copy {trailer}"
        )));
    }
    Ok(())
}

fn read_pcapng_record<R: Read>(
    reader: &mut R,
    state: &mut State,
    frame: u64,
) -> Result<Option<CaptureRecord>, PcapError> {
    loop {
        let big_endian = match state {
            State::PcapNg { big_endian, .. } => *big_endian,
            State::Pcap { .. } => return Err(malformed("internal: not a pcapng reader")),
        };
        let mut hdr = [0u8; 8];
        let n = read_up_to(reader, &mut hdr[..4])?;
        if n == 0 {
            return Ok(None);
        }
        if n < 4 {
            return Err(malformed("truncated pcapng block header"));
        }
        if hdr[..4] == PCAPNG_SHB {
            read_section_header(reader, state)?;
            continue;
        }
        if read_up_to(reader, &mut hdr[4..])? < 4 {
            return Err(malformed("truncated pcapng block header"));
        }
        let btype = get_u32(&hdr, 0, big_endian).unwrap_or(0);
        let blen = get_u32(&hdr, 4, big_endian).unwrap_or(0);
        if !(12..=MAX_BLOCK_LEN).contains(&blen) || blen & 3 != 0 {
            return Err(malformed(format!(
                "bad pcapng block length {blen} (block type {btype:#x})"
            )));
        }
        let body_len = blen - 12;
        let body = match btype {
            PCAPNG_IDB | PCAPNG_PB | PCAPNG_SPB | PCAPNG_EPB => {
                Some(read_vec(reader, body_len)?.ok_or_else(|| {
                    malformed(format!("truncated pcapng block (type {btype:#x})"))
                })?)
            }
            _ => {
                // Name resolution, statistics, custom, ... blocks: skip.
                let skipped =
                    io::copy(&mut reader.by_ref().take(body_len.into()), &mut io::sink())?;
                if skipped < u64::from(body_len) {
                    return Err(malformed(format!(
                        "truncated pcapng block (type {btype:#x})"
                    )));
                }
                None
            }
        };
        check_trailer(reader, blen, big_endian)?;
        let Some(body) = body else { continue };
        let State::PcapNg { interfaces, .. } = state else {
            return Err(malformed("internal: not a pcapng reader"));
        };
        match btype {
            PCAPNG_IDB => {
                if interfaces.len() >= MAX_INTERFACES {
                    return Err(malformed(format!(
                        "more than {MAX_INTERFACES} interfaces in one pcapng section"
                    )));
                }
                interfaces.push(parse_idb(&body, big_endian)?);
            }
            PCAPNG_EPB | PCAPNG_PB => {
                let short = || malformed(format!("pcapng packet block of frame {frame} too short"));
                let (iid, rest) = if btype == PCAPNG_EPB {
                    (get_u32(&body, 0, big_endian).ok_or_else(short)?, 4)
                } else {
                    let iid = get_u16(&body, 0, big_endian).ok_or_else(short)?;
                    (u32::from(iid), 4)
                };
                let ts_high = get_u32(&body, rest, big_endian).ok_or_else(short)?;
                let ts_low = get_u32(&body, rest + 4, big_endian).ok_or_else(short)?;
                let caplen = get_u32(&body, rest + 8, big_endian).ok_or_else(short)?;
                let orig_len = get_u32(&body, rest + 12, big_endian).ok_or_else(short)?;
                let iface = usize::try_from(iid)
                    .ok()
                    .and_then(|i| interfaces.get(i))
                    .ok_or_else(|| {
                        malformed(format!("frame {frame} refers to unknown interface {iid}"))
                    })?;
                if caplen > MAX_RECORD_LEN {
                    return Err(malformed(format!(
                        "frame {frame} claims a captured length of {caplen} bytes \
                         (limit {MAX_RECORD_LEN})"
                    )));
                }
                let data = take_data(body, 20, caplen).ok_or_else(|| {
                    malformed(format!(
                        "frame {frame}: captured length {caplen} overruns its pcapng block"
                    ))
                })?;
                let ts = (u64::from(ts_high) << 32) | u64::from(ts_low);
                return Ok(Some(CaptureRecord {
                    frame,
                    ts_ns: ts_to_ns(ts, iface.resol, iface.offset_s),
                    link: iface.link,
                    data,
                    orig_len,
                }));
            }
            PCAPNG_SPB => {
                let iface = interfaces.first().ok_or_else(|| {
                    malformed(format!(
                        "simple packet block (frame {frame}) before any interface"
                    ))
                })?;
                let orig_len = get_u32(&body, 0, big_endian).ok_or_else(|| {
                    malformed(format!("simple packet block of frame {frame} too short"))
                })?;
                let room = u32::try_from(body.len() - 4).unwrap_or(u32::MAX);
                let mut caplen = orig_len.min(room);
                if iface.snaplen != 0 {
                    caplen = caplen.min(iface.snaplen);
                }
                let link = iface.link;
                let data = take_data(body, 4, caplen)
                    .ok_or_else(|| malformed("simple packet block overrun"))?;
                return Ok(Some(CaptureRecord {
                    frame,
                    ts_ns: 0,
                    link,
                    data,
                    orig_len,
                }));
            }
            _ => {}
        }
    }
}

fn parse_idb(body: &[u8], big_endian: bool) -> Result<Interface, PcapError> {
    let short = || malformed("pcapng interface description block too short");
    let link = get_u16(body, 0, big_endian).ok_or_else(short)?;
    let snaplen = get_u32(body, 4, big_endian).ok_or_else(short)?;
    let mut iface = Interface {
        link: LinkType::from_linktype(u32::from(link)),
        snaplen,
        resol: TsResol::Decimal(6),
        offset_s: 0,
    };
    let mut off = 8usize;
    while let (Some(code), Some(olen)) = (
        get_u16(body, off, big_endian),
        get_u16(body, off + 2, big_endian),
    ) {
        if code == OPT_END {
            break;
        }
        let olen = usize::from(olen);
        let value = body
            .get(off + 4..off + 4 + olen)
            .ok_or_else(|| malformed("pcapng interface option overruns its block"))?;
        match code {
            OPT_IF_TSRESOL if olen >= 1 => {
                let r = value[0];
                iface.resol = if r & 0x80 != 0 {
                    TsResol::Binary(r & 0x7F)
                } else {
                    TsResol::Decimal(r)
                };
            }
            OPT_IF_TSOFFSET if olen >= 8 => {
                iface.offset_s = get_u64(value, 0, big_endian).map_or(0, |v| v as i64);
            }
            _ => {}
        }
        off += 4 + olen.next_multiple_of(4);
    }
    Ok(iface)
}

/// Turn `body` into its bytes `start..start + len` without copying it.
fn take_data(mut body: Vec<u8>, start: usize, len: u32) -> Option<Vec<u8>> {
    let len = usize::try_from(len).ok()?;
    let end = start.checked_add(len)?;
    if end > body.len() {
        return None;
    }
    body.truncate(end);
    body.drain(..start);
    Some(body)
}

/// Convert a pcapng timestamp to nanoseconds since the epoch, saturating at
/// 0 and `u64::MAX`.
fn ts_to_ns(ts: u64, resol: TsResol, offset_s: i64) -> u64 {
    let ts = u128::from(ts);
    let ns: u128 = match resol {
        TsResol::Decimal(r) if r <= 9 => ts * 10u128.pow(9 - u32::from(r)),
        TsResol::Decimal(r) => {
            let d = u32::from(r) - 9;
            if d > 38 {
                0
            } else {
                ts / 10u128.pow(d)
            }
        }
        TsResol::Binary(p) => (ts * u128::from(NS_PER_SEC)) >> p,
    };
    let total = i128::try_from(ns)
        .unwrap_or(i128::MAX)
        .saturating_add(i128::from(offset_s) * i128::from(NS_PER_SEC));
    u64::try_from(total.max(0)).unwrap_or(u64::MAX)
}

/// Fill as much of `buf` as the reader can give; fewer bytes than asked for
/// means end of input.
fn read_up_to<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match reader.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n = n.saturating_add(k).min(buf.len()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Read exactly `len` bytes, growing the buffer only as data arrives (so a
/// lying length field in a short file costs no big allocation). `None` if the
/// input ends first.
fn read_vec<R: Read>(reader: &mut R, len: u32) -> io::Result<Option<Vec<u8>>> {
    let want = usize::try_from(len).unwrap_or(usize::MAX);
    let mut data = Vec::with_capacity(want.min(64 * 1024));
    reader
        .by_ref()
        .take(u64::from(len))
        .read_to_end(&mut data)?;
    Ok((data.len() == want).then_some(data))
}

fn get_u16(b: &[u8], off: usize, big_endian: bool) -> Option<u16> {
    let bytes: [u8; 2] = b.get(off..off.checked_add(2)?)?.try_into().ok()?;
    Some(if big_endian {
        u16::from_be_bytes(bytes)
    } else {
        u16::from_le_bytes(bytes)
    })
}

fn get_u32(b: &[u8], off: usize, big_endian: bool) -> Option<u32> {
    let bytes: [u8; 4] = b.get(off..off.checked_add(4)?)?.try_into().ok()?;
    Some(if big_endian {
        u32::from_be_bytes(bytes)
    } else {
        u32::from_le_bytes(bytes)
    })
}

fn get_u64(b: &[u8], off: usize, big_endian: bool) -> Option<u64> {
    let bytes: [u8; 8] = b.get(off..off.checked_add(8)?)?.try_into().ok()?;
    Some(if big_endian {
        u64::from_be_bytes(bytes)
    } else {
        u64::from_le_bytes(bytes)
    })
}

fn be16(b: &[u8], off: usize) -> Option<u16> {
    get_u16(b, off, true)
}

/// The network-layer datagram inside a link-layer frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3<'a> {
    /// An IPv4 datagram (never empty).
    Ipv4(&'a [u8]),
    /// An IPv6 datagram (never empty).
    Ipv6(&'a [u8]),
    /// A frame whose network layer is not IP (e.g. RoCEv1, ethertype 0x8915,
    /// or ARP).
    Other {
        /// The ethertype (or Linux cooked-capture protocol) of the frame.
        ethertype: u16,
    },
}

fn by_ethertype(ethertype: u16, rest: &[u8]) -> Option<L3<'_>> {
    match ethertype {
        ETHERTYPE_IPV4 if !rest.is_empty() => Some(L3::Ipv4(rest)),
        ETHERTYPE_IPV6 if !rest.is_empty() => Some(L3::Ipv6(rest)),
        ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => None,
        _ => Some(L3::Other { ethertype }),
    }
}

fn by_version(data: &[u8]) -> Option<L3<'_>> {
    match data.first()? >> 4 {
        4 => Some(L3::Ipv4(data)),
        6 => Some(L3::Ipv6(data)),
        _ => None,
    }
}

fn by_family(family: u32, rest: &[u8]) -> Option<L3<'_>> {
    if rest.is_empty() {
        return None;
    }
    match family {
        2 => Some(L3::Ipv4(rest)),
        10 | 24 | 28 | 30 => Some(L3::Ipv6(rest)),
        _ => None,
    }
}

/// Strip the link-layer header off `data`.
///
/// Handles Ethernet (with any number of 802.1Q/802.1ad VLAN tags, TPIDs in
/// [`VLAN_TPIDS`]), Linux cooked SLL (16-byte header, protocol at offset 14)
/// and SLL2 (20-byte header, protocol at offset 0), raw IP (version from the
/// first nibble), the IPv4/IPv6 link types, and BSD NULL/LOOP (family 2 is
/// IPv4; 10, 24, 28 and 30 are IPv6; a NULL family that does not fit in 16
/// bits is read in the other byte order). Returns `None` when the frame is too
/// short (an IP datagram must hold at least one byte), the raw IP version or
/// loopback family is not IP, or the link type is unknown.
pub fn link_payload(link: LinkType, data: &[u8]) -> Option<L3<'_>> {
    match link {
        LinkType::Ethernet => {
            let mut ethertype = be16(data, 12)?;
            let mut off = 14usize;
            while VLAN_TPIDS.contains(&ethertype) {
                ethertype = be16(data, off + 2)?;
                off += 4;
            }
            by_ethertype(ethertype, data.get(off..)?)
        }
        LinkType::LinuxSll => by_ethertype(be16(data, 14)?, data.get(16..)?),
        LinkType::LinuxSll2 => {
            let protocol = be16(data, 0)?;
            by_ethertype(protocol, data.get(20..)?)
        }
        LinkType::RawIp => by_version(data),
        LinkType::Ipv4 => (!data.is_empty()).then_some(L3::Ipv4(data)),
        LinkType::Ipv6 => (!data.is_empty()).then_some(L3::Ipv6(data)),
        LinkType::Null => {
            let mut family = get_u32(data, 0, false)?;
            if family > 0xFFFF {
                family = family.swap_bytes();
            }
            by_family(family, data.get(4..)?)
        }
        LinkType::Loop => by_family(get_u32(data, 0, true)?, data.get(4..)?),
        LinkType::Other(_) => None,
    }
}

/// Call `f` with the frame number, UDP datagram and parsed RoCEv2 packet of
/// every record of `capture` that holds one (other records are skipped).
pub fn for_each_roce_packet<R: Read>(
    capture: R,
    mut f: impl FnMut(u64, &crate::frame::Datagram<'_>, &crate::PacketRepr<'_>),
) -> Result<(), PcapError> {
    for rec in CaptureReader::new(capture)? {
        let rec = rec?;
        let Some(L3::Ipv4(ip) | L3::Ipv6(ip)) = link_payload(rec.link, &rec.data) else {
            continue;
        };
        let Ok(dg) = crate::frame::Datagram::parse(ip) else {
            continue;
        };
        if let Ok(p) = crate::PacketRepr::parse_bytes(dg.payload) {
            f(rec.frame, &dg, &p);
        }
    }
    Ok(())
}

/// Writes a classic pcap file (nanosecond-resolution magic 0xa1b23c4d,
/// little-endian, version 2.4, snaplen [`WRITER_SNAPLEN`]) with Ethernet
/// framing, so Wireshark, tshark and other tools read it.
///
/// Every call writes straight to `W`; wrap a file in a [`BufWriter`] (as
/// [`create`] does) and call [`flush`](Self::flush) or
/// [`into_inner`](Self::into_inner) at the end.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    writer: W,
    frame: Vec<u8>,
}

impl<W: Write> PcapWriter<W> {
    /// Write the global header (snaplen 262144, `LINKTYPE_ETHERNET`).
    pub fn new(mut writer: W) -> Result<Self, PcapError> {
        let mut hdr = [0u8; 24];
        hdr[0..4].copy_from_slice(&0xA1B2_3C4Du32.to_le_bytes());
        hdr[4..6].copy_from_slice(&2u16.to_le_bytes());
        hdr[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone and sigfigs stay 0.
        hdr[16..20].copy_from_slice(&WRITER_SNAPLEN.to_le_bytes());
        hdr[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        writer.write_all(&hdr)?;
        Ok(Self {
            writer,
            frame: Vec::new(),
        })
    }

    /// Wrap an IPv4 or IPv6 datagram (version taken from its first nibble) in
    /// an Ethernet header with fixed locally administered MACs (dst
    /// [`WRITER_DST_MAC`], src [`WRITER_SRC_MAC`]) and ethertype 0x0800 /
    /// 0x86DD, and append it.
    ///
    /// Fails with [`PcapError::InvalidInput`] if the datagram is empty, not
    /// IPv4/IPv6, or too long for the snapshot length.
    pub fn write_ip(&mut self, ts_ns: u64, datagram: &[u8]) -> Result<(), PcapError> {
        let ethertype = match datagram.first().map(|b| b >> 4) {
            None => return Err(PcapError::InvalidInput("empty IP datagram".into())),
            Some(4) => ETHERTYPE_IPV4,
            Some(6) => ETHERTYPE_IPV6,
            Some(v) => {
                return Err(PcapError::InvalidInput(format!(
                    "IP version {v} is neither 4 nor 6"
                )))
            }
        };
        let mut frame = std::mem::take(&mut self.frame);
        frame.clear();
        frame.extend_from_slice(&WRITER_DST_MAC);
        frame.extend_from_slice(&WRITER_SRC_MAC);
        frame.extend_from_slice(&ethertype.to_be_bytes());
        frame.extend_from_slice(datagram);
        let result = self.write_ethernet(ts_ns, &frame);
        self.frame = frame;
        result
    }

    /// Append a ready Ethernet frame (at least the 14-byte header, at most
    /// [`WRITER_SNAPLEN`] bytes; anything else is [`PcapError::InvalidInput`],
    /// as is a timestamp past the year 2106).
    pub fn write_ethernet(&mut self, ts_ns: u64, frame: &[u8]) -> Result<(), PcapError> {
        let len = u32::try_from(frame.len())
            .ok()
            .filter(|&n| (14..=WRITER_SNAPLEN).contains(&n))
            .ok_or_else(|| {
                PcapError::InvalidInput(format!(
                    "Ethernet frame of {} bytes (must be 14 to {WRITER_SNAPLEN})",
                    frame.len()
                ))
            })?;
        let sec = u32::try_from(ts_ns / NS_PER_SEC).map_err(|_| {
            PcapError::InvalidInput(format!("timestamp {ts_ns} ns does not fit in pcap"))
        })?;
        // Always below 10^9, so it fits.
        let nsec = u32::try_from(ts_ns % NS_PER_SEC).unwrap_or(0);
        let mut hdr = [0u8; 16];
        hdr[0..4].copy_from_slice(&sec.to_le_bytes());
        hdr[4..8].copy_from_slice(&nsec.to_le_bytes());
        hdr[8..12].copy_from_slice(&len.to_le_bytes());
        hdr[12..16].copy_from_slice(&len.to_le_bytes());
        self.writer.write_all(&hdr)?;
        self.writer.write_all(frame)?;
        Ok(())
    }

    /// Flush the underlying writer.
    pub fn flush(&mut self) -> Result<(), PcapError> {
        self.writer.flush()?;
        Ok(())
    }

    /// Flush and give back the underlying writer.
    pub fn into_inner(mut self) -> Result<W, PcapError> {
        self.writer.flush()?;
        Ok(self.writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Cursor;

    const IPV4: &[u8] = &[
        0x45, 0x02, 0x00, 0x20, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 10, 0, 0, 1, 10, 0,
        0, 2, 0xC0, 0x00, 0x12, 0xB7, 0x00, 0x0C, 0x00, 0x00, 0xAA, 0xBB, 0xCC, 0xDD,
    ];

    fn ipv6() -> Vec<u8> {
        let mut d = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        d.extend_from_slice(&[0xFE; 16]);
        d.extend_from_slice(&[0xFD; 16]);
        d.extend_from_slice(&[0xC0, 0x00, 0x12, 0xB7, 0, 8, 0, 0]);
        d
    }

    fn read_all(bytes: &[u8]) -> Vec<CaptureRecord> {
        CaptureReader::new(Cursor::new(bytes))
            .expect("header")
            .collect::<Result<Vec<_>, _>>()
            .expect("records")
    }

    #[test]
    fn linktype_values_round_trip() {
        for v in [0, 1, 101, 108, 113, 228, 229, 276, 147, 9999] {
            assert_eq!(LinkType::from_linktype(v).to_linktype(), v);
        }
        assert_eq!(LinkType::from_linktype(12), LinkType::RawIp);
        assert_eq!(LinkType::from_linktype(14), LinkType::RawIp);
        assert_eq!(LinkType::from_linktype(147), LinkType::Other(147));
    }

    #[test]
    fn writer_round_trip() {
        let v6 = ipv6();
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_ip(1_700_000_000_123_456_789, IPV4).unwrap();
        w.write_ip(1_700_000_001_000_000_001, &v6).unwrap();
        let mut eth = vec![0xFF; 12];
        eth.extend_from_slice(&[0x89, 0x15, 1, 2, 3]);
        w.write_ethernet(5, &eth).unwrap();
        w.flush().unwrap();
        let bytes = w.into_inner().unwrap();
        assert_eq!(&bytes[..4], &[0x4D, 0x3C, 0xB2, 0xA1]);
        assert_eq!(&bytes[16..24], &[0, 0, 4, 0, 1, 0, 0, 0]);

        let reader = CaptureReader::new(Cursor::new(&bytes)).unwrap();
        assert_eq!(reader.format(), CaptureFormat::Pcap);
        assert_eq!(reader.link_type(), Some(LinkType::Ethernet));
        let recs: Vec<_> = reader.map(Result::unwrap).collect();
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[0].frame, 1);
        assert_eq!(recs[0].ts_ns, 1_700_000_000_123_456_789);
        assert_eq!(recs[0].link, LinkType::Ethernet);
        assert_eq!(&recs[0].data[..6], &WRITER_DST_MAC);
        assert_eq!(&recs[0].data[6..12], &WRITER_SRC_MAC);
        assert_eq!(&recs[0].data[12..14], &[0x08, 0x00]);
        assert_eq!(&recs[0].data[14..], IPV4);
        assert_eq!(recs[0].orig_len as usize, 14 + IPV4.len());
        assert!(!recs[0].is_truncated());
        assert_eq!(
            link_payload(recs[0].link, &recs[0].data),
            Some(L3::Ipv4(IPV4))
        );
        assert_eq!(recs[1].frame, 2);
        assert_eq!(recs[1].ts_ns, 1_700_000_001_000_000_001);
        assert_eq!(&recs[1].data[12..14], &[0x86, 0xDD]);
        assert_eq!(
            link_payload(recs[1].link, &recs[1].data),
            Some(L3::Ipv6(&v6[..]))
        );
        assert_eq!((recs[2].frame, recs[2].ts_ns), (3, 5));
        assert_eq!(recs[2].data, eth);
        assert_eq!(
            link_payload(recs[2].link, &recs[2].data),
            Some(L3::Other { ethertype: 0x8915 })
        );
    }

    #[test]
    fn writer_rejects_bad_input() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        for bad in [&[][..], &[0x55, 0, 0][..], &[0x00][..]] {
            assert!(matches!(
                w.write_ip(0, bad),
                Err(PcapError::InvalidInput(_))
            ));
        }
        assert!(matches!(
            w.write_ethernet(0, &[0; 13]),
            Err(PcapError::InvalidInput(_))
        ));
        assert!(matches!(
            w.write_ethernet(0, &vec![0; WRITER_SNAPLEN as usize + 1]),
            Err(PcapError::InvalidInput(_))
        ));
        assert!(matches!(
            w.write_ip(u64::MAX, IPV4),
            Err(PcapError::InvalidInput(_))
        ));
        // Nothing but the header was written.
        assert_eq!(w.into_inner().unwrap().len(), 24);
    }

    fn classic_be_us(records: &[(u32, u32, &[u8], u32)], linktype: u32) -> Vec<u8> {
        let mut f = vec![0xA1, 0xB2, 0xC3, 0xD4, 0, 2, 0, 4];
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65535u32.to_be_bytes());
        f.extend_from_slice(&linktype.to_be_bytes());
        for (sec, usec, data, orig) in records {
            f.extend_from_slice(&sec.to_be_bytes());
            f.extend_from_slice(&usec.to_be_bytes());
            f.extend_from_slice(&(data.len() as u32).to_be_bytes());
            f.extend_from_slice(&orig.to_be_bytes());
            f.extend_from_slice(data);
        }
        f
    }

    #[test]
    fn classic_big_endian_microseconds() {
        let v6 = ipv6();
        let f = classic_be_us(
            &[(1_600_000_000, 999_999, IPV4, 1500), (7, 1, &v6, 72)],
            101,
        );
        let recs = read_all(&f);
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].frame, 1);
        assert_eq!(recs[0].ts_ns, 1_600_000_000_999_999_000);
        assert_eq!(recs[0].link, LinkType::RawIp);
        assert_eq!(recs[0].data, IPV4);
        assert_eq!(recs[0].orig_len, 1500);
        assert!(recs[0].is_truncated());
        assert_eq!(
            link_payload(recs[0].link, &recs[0].data),
            Some(L3::Ipv4(IPV4))
        );
        assert_eq!((recs[1].frame, recs[1].ts_ns), (2, 7_000_001_000));
        assert_eq!(recs[1].data, v6);
        assert_eq!(
            link_payload(recs[1].link, &recs[1].data),
            Some(L3::Ipv6(&v6[..]))
        );
    }

    #[test]
    fn classic_little_endian_nanoseconds_and_modified() {
        // ns magic, little-endian, SLL.
        let mut f = vec![0x4D, 0x3C, 0xB2, 0xA1, 2, 0, 4, 0];
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65535u32.to_le_bytes());
        f.extend_from_slice(&113u32.to_le_bytes());
        let mut sll = vec![0; 14];
        sll.extend_from_slice(&[0x08, 0x00]);
        sll.extend_from_slice(IPV4);
        for v in [3u32, 123_456_789, sll.len() as u32, sll.len() as u32] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        f.extend_from_slice(&sll);
        let recs = read_all(&f);
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].ts_ns, 3_123_456_789);
        assert_eq!(recs[0].link, LinkType::LinuxSll);
        assert_eq!(
            link_payload(recs[0].link, &recs[0].data),
            Some(L3::Ipv4(IPV4))
        );

        // Kuznetzov's modified pcap: 8 more bytes per record header.
        let mut f = vec![0x34, 0xCD, 0xB2, 0xA1, 2, 0, 4, 0];
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65535u32.to_le_bytes());
        f.extend_from_slice(&228u32.to_le_bytes());
        for v in [9u32, 10, IPV4.len() as u32, IPV4.len() as u32, 0, 0] {
            f.extend_from_slice(&v.to_le_bytes());
        }
        f.extend_from_slice(IPV4);
        let recs = read_all(&f);
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].ts_ns, 9_000_010_000);
        assert_eq!(recs[0].data, IPV4);
        assert_eq!(
            link_payload(recs[0].link, &recs[0].data),
            Some(L3::Ipv4(IPV4))
        );
    }

    /// A pcapng writer for tests, in either byte order.
    struct Ng {
        out: Vec<u8>,
        be: bool,
    }

    impl Ng {
        fn new() -> Self {
            Self {
                out: Vec::new(),
                be: false,
            }
        }
        fn u16(&self, v: u16) -> [u8; 2] {
            if self.be {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        }
        fn u32(&self, v: u32) -> [u8; 4] {
            if self.be {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        }
        fn block(&mut self, btype: u32, body: &[u8]) {
            let mut body = body.to_vec();
            while body.len() & 3 != 0 {
                body.push(0);
            }
            let len = body.len() as u32 + 12;
            self.out.extend_from_slice(&self.u32(btype));
            self.out.extend_from_slice(&self.u32(len));
            self.out.extend_from_slice(&body);
            self.out.extend_from_slice(&self.u32(len));
        }
        fn shb(&mut self, be: bool) {
            self.be = be;
            let mut body = self.u32(PCAPNG_BOM).to_vec();
            body.extend_from_slice(&self.u16(1));
            body.extend_from_slice(&self.u16(0));
            body.extend_from_slice(&[0xFF; 8]); // section length unknown
                                                // shb_userappl option, then end of options.
            body.extend_from_slice(&self.u16(4));
            body.extend_from_slice(&self.u16(5));
            body.extend_from_slice(b"roxe\0\0\0\0");
            body.extend_from_slice(&[0; 4]);
            self.block(0x0A0D_0D0A, &body);
        }
        fn idb(&mut self, linktype: u16, snaplen: u32, opts: &[(u16, &[u8])]) {
            let mut body = self.u16(linktype).to_vec();
            body.extend_from_slice(&[0, 0]);
            body.extend_from_slice(&self.u32(snaplen));
            for (code, val) in opts {
                body.extend_from_slice(&self.u16(*code));
                body.extend_from_slice(&self.u16(val.len() as u16));
                body.extend_from_slice(val);
                while body.len() & 3 != 0 {
                    body.push(0);
                }
            }
            if !opts.is_empty() {
                body.extend_from_slice(&[0; 4]);
            }
            self.block(PCAPNG_IDB, &body);
        }
        fn epb(&mut self, iface: u32, ts: u64, data: &[u8], orig: u32) {
            let mut body = self.u32(iface).to_vec();
            body.extend_from_slice(&self.u32((ts >> 32) as u32));
            body.extend_from_slice(&self.u32(ts as u32));
            body.extend_from_slice(&self.u32(data.len() as u32));
            body.extend_from_slice(&self.u32(orig));
            body.extend_from_slice(data);
            self.block(PCAPNG_EPB, &body);
        }
        fn spb(&mut self, data: &[u8], orig: u32) {
            let mut body = self.u32(orig).to_vec();
            body.extend_from_slice(data);
            self.block(PCAPNG_SPB, &body);
        }
    }

    fn eth_frame(ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0x11; 12];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn pcapng_sections_interfaces_and_resolutions() {
        let v6 = ipv6();
        let eth = eth_frame(ETHERTYPE_IPV4, IPV4);
        let mut sll2 = vec![0x86, 0xDD];
        sll2.extend_from_slice(&[0; 18]);
        sll2.extend_from_slice(&v6);

        let mut ng = Ng::new();
        ng.shb(false);
        // Interface 0: Ethernet, default resolution (µs).
        ng.idb(1, 0, &[]);
        // Interface 1: Linux SLL2, if_tsresol = 9 (ns).
        ng.idb(276, 0, &[(OPT_IF_TSRESOL, &[9])]);
        // A name resolution block, which is skipped.
        ng.block(4, &[0; 8]);
        ng.epb(0, 1_700_000_000_123_456, &eth, eth.len() as u32);
        ng.epb(1, 1_700_000_000_987_654_321, &sll2, 4000);
        // Section 2, big-endian: raw IP with binary resolution 2^-10 s and
        // an offset of 100 s; a simple packet block truncated by snaplen.
        ng.shb(true);
        let offset = 100i64.to_be_bytes();
        ng.idb(
            101,
            20,
            &[(OPT_IF_TSRESOL, &[0x80 | 10]), (OPT_IF_TSOFFSET, &offset)],
        );
        ng.epb(0, 1024 * 5 + 512, IPV4, IPV4.len() as u32);
        ng.spb(IPV4, IPV4.len() as u32);

        let reader = CaptureReader::new(Cursor::new(&ng.out)).unwrap();
        assert_eq!(reader.format(), CaptureFormat::PcapNg);
        let recs: Vec<_> = reader.map(Result::unwrap).collect();
        assert_eq!(recs.len(), 4);
        assert_eq!(
            recs.iter().map(|r| r.frame).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );

        assert_eq!(recs[0].link, LinkType::Ethernet);
        assert_eq!(recs[0].ts_ns, 1_700_000_000_123_456_000);
        assert_eq!(recs[0].data, eth);
        assert_eq!(
            link_payload(recs[0].link, &recs[0].data),
            Some(L3::Ipv4(IPV4))
        );

        assert_eq!(recs[1].link, LinkType::LinuxSll2);
        assert_eq!(recs[1].ts_ns, 1_700_000_000_987_654_321);
        assert_eq!(recs[1].data, sll2);
        assert_eq!(recs[1].orig_len, 4000);
        assert_eq!(
            link_payload(recs[1].link, &recs[1].data),
            Some(L3::Ipv6(&v6[..]))
        );

        assert_eq!(recs[2].link, LinkType::RawIp);
        assert_eq!(recs[2].ts_ns, 105_500_000_000);
        assert_eq!(recs[2].data, IPV4);

        assert_eq!(recs[3].link, LinkType::RawIp);
        assert_eq!(recs[3].ts_ns, 0);
        assert_eq!(recs[3].data, &IPV4[..20]);
        assert_eq!(recs[3].orig_len, IPV4.len() as u32);
        assert!(recs[3].is_truncated());
    }

    #[test]
    fn pcapng_errors() {
        // Packet for an interface that was never described.
        let mut ng = Ng::new();
        ng.shb(false);
        ng.idb(1, 0, &[]);
        ng.epb(1, 0, &eth_frame(0x0806, &[0; 28]), 42);
        let mut r = CaptureReader::new(Cursor::new(&ng.out)).unwrap();
        assert!(matches!(r.next(), Some(Err(PcapError::Malformed(_)))));
        assert!(r.next().is_none());

        // Leading and trailing block lengths disagree.
        let mut ng = Ng::new();
        ng.shb(false);
        ng.idb(1, 0, &[]);
        let n = ng.out.len();
        ng.out[n - 4] ^= 4;
        let mut r = CaptureReader::new(Cursor::new(&ng.out)).unwrap();
        assert!(matches!(r.next(), Some(Err(PcapError::Malformed(_)))));

        // Captured length beyond the block.
        let mut ng = Ng::new();
        ng.shb(false);
        ng.idb(1, 0, &[]);
        ng.epb(0, 0, &[0; 16], 16);
        let caplen_at = ng.out.len() - 4 - 16 - 8;
        ng.out[caplen_at] = 17;
        let mut r = CaptureReader::new(Cursor::new(&ng.out)).unwrap();
        assert!(matches!(r.next(), Some(Err(PcapError::Malformed(_)))));

        // Bad byte-order magic.
        let mut ng = Ng::new();
        ng.shb(false);
        ng.out[8] = 0;
        assert!(matches!(
            CaptureReader::new(Cursor::new(&ng.out)),
            Err(PcapError::Malformed(_))
        ));
    }

    #[test]
    fn not_a_capture() {
        for input in [&b""[..], b"ab", b"GIF89a", b"\x1f\x8b\x08\x00"] {
            let err = CaptureReader::new(Cursor::new(input)).unwrap_err();
            assert!(matches!(err, PcapError::NotACapture { .. }), "{err}");
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn truncated_and_lying_classic_files() {
        let full = classic_be_us(&[(1, 2, IPV4, 32), (3, 4, IPV4, 32)], 1);
        // Every proper prefix either fails to open or ends with an error,
        // except the ones that end exactly on a record boundary.
        let boundaries = [24, 24 + 16 + IPV4.len(), full.len()];
        for cut in 0..full.len() {
            let res: Result<Vec<_>, _> =
                CaptureReader::new(Cursor::new(&full[..cut])).and_then(|r| r.collect());
            assert_eq!(res.is_ok(), boundaries.contains(&cut), "cut at {cut}");
        }
        // A captured length far beyond the limit is rejected without
        // allocating it.
        let mut lying = full.clone();
        lying[24 + 8..24 + 12].copy_from_slice(&u32::MAX.to_be_bytes());
        let mut r = CaptureReader::new(Cursor::new(&lying)).unwrap();
        assert!(matches!(r.next(), Some(Err(PcapError::Malformed(_)))));
        assert!(r.next().is_none());
        // Just under the limit, but the file is short: a truncation error.
        lying[24 + 8..24 + 12].copy_from_slice(&MAX_RECORD_LEN.to_be_bytes());
        let mut r = CaptureReader::new(Cursor::new(&lying)).unwrap();
        assert!(matches!(r.next(), Some(Err(PcapError::Malformed(_)))));
    }

    #[test]
    fn link_payload_ethernet_and_vlans() {
        let f = eth_frame(ETHERTYPE_IPV4, IPV4);
        assert_eq!(link_payload(LinkType::Ethernet, &f), Some(L3::Ipv4(IPV4)));

        let mut one = vec![0x11; 12];
        one.extend_from_slice(&[0x81, 0x00, 0x00, 0x05, 0x86, 0xDD]);
        one.extend_from_slice(&ipv6());
        assert_eq!(
            link_payload(LinkType::Ethernet, &one),
            Some(L3::Ipv6(&ipv6()[..]))
        );

        let mut two = vec![0x11; 12];
        two.extend_from_slice(&[0x88, 0xA8, 0x00, 0x64, 0x81, 0x00, 0x00, 0x05, 0x08, 0x00]);
        two.extend_from_slice(IPV4);
        assert_eq!(link_payload(LinkType::Ethernet, &two), Some(L3::Ipv4(IPV4)));

        let v1 = eth_frame(ETHERTYPE_ROCEV1, &[0x60; 40]);
        assert_eq!(
            link_payload(LinkType::Ethernet, &v1),
            Some(L3::Other { ethertype: 0x8915 })
        );
        let arp = eth_frame(0x0806, &[]);
        assert_eq!(
            link_payload(LinkType::Ethernet, &arp),
            Some(L3::Other { ethertype: 0x0806 })
        );

        // Too short: no full header, a cut VLAN tag, an empty IP payload.
        for n in 0..14 {
            assert_eq!(link_payload(LinkType::Ethernet, &f[..n]), None);
        }
        for n in 14..18 {
            assert_eq!(link_payload(LinkType::Ethernet, &two[..n]), None, "{n}");
        }
        assert_eq!(link_payload(LinkType::Ethernet, &two[..22]), None);
        assert_eq!(link_payload(LinkType::Ethernet, &f[..14]), None);
    }

    #[test]
    fn link_payload_cooked_raw_and_loopback() {
        let v6 = ipv6();
        let mut sll = vec![0, 0, 0, 1, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0, 0x08, 0x00];
        sll.extend_from_slice(IPV4);
        assert_eq!(link_payload(LinkType::LinuxSll, &sll), Some(L3::Ipv4(IPV4)));
        let mut sll_v1 = sll[..16].to_vec();
        sll_v1[14..16].copy_from_slice(&[0x89, 0x15]);
        assert_eq!(
            link_payload(LinkType::LinuxSll, &sll_v1),
            Some(L3::Other { ethertype: 0x8915 })
        );

        let mut sll2 = vec![
            0x86, 0xDD, 0, 0, 0, 0, 0, 2, 0, 1, 4, 6, 1, 2, 3, 4, 5, 6, 0, 0,
        ];
        sll2.extend_from_slice(&v6);
        assert_eq!(
            link_payload(LinkType::LinuxSll2, &sll2),
            Some(L3::Ipv6(&v6[..]))
        );

        assert_eq!(link_payload(LinkType::RawIp, IPV4), Some(L3::Ipv4(IPV4)));
        assert_eq!(link_payload(LinkType::RawIp, &v6), Some(L3::Ipv6(&v6[..])));
        assert_eq!(link_payload(LinkType::RawIp, &[0x55, 0]), None);
        assert_eq!(link_payload(LinkType::Ipv4, IPV4), Some(L3::Ipv4(IPV4)));
        assert_eq!(link_payload(LinkType::Ipv6, &v6), Some(L3::Ipv6(&v6[..])));

        let mut null = 2u32.to_le_bytes().to_vec();
        null.extend_from_slice(IPV4);
        assert_eq!(link_payload(LinkType::Null, &null), Some(L3::Ipv4(IPV4)));
        // A NULL header written on a big-endian host.
        let mut null_be = 30u32.to_be_bytes().to_vec();
        null_be.extend_from_slice(&v6);
        assert_eq!(
            link_payload(LinkType::Null, &null_be),
            Some(L3::Ipv6(&v6[..]))
        );
        for family in [10u32, 24, 28, 30] {
            let mut lo = family.to_be_bytes().to_vec();
            lo.extend_from_slice(&v6);
            assert_eq!(link_payload(LinkType::Loop, &lo), Some(L3::Ipv6(&v6[..])));
        }
        let mut lo = 2u32.to_be_bytes().to_vec();
        lo.extend_from_slice(IPV4);
        assert_eq!(link_payload(LinkType::Loop, &lo), Some(L3::Ipv4(IPV4)));
        lo[3] = 7;
        assert_eq!(link_payload(LinkType::Loop, &lo), None);

        assert_eq!(link_payload(LinkType::Other(147), IPV4), None);

        // Too short for each header.
        for n in 0..=16 {
            assert_eq!(link_payload(LinkType::LinuxSll, &sll[..n]), None);
        }
        for n in 0..=20 {
            assert_eq!(link_payload(LinkType::LinuxSll2, &sll2[..n]), None);
        }
        for n in 0..=4 {
            assert_eq!(link_payload(LinkType::Null, &null[..n]), None);
            assert_eq!(link_payload(LinkType::Loop, &lo[..n]), None);
        }
        for link in [LinkType::RawIp, LinkType::Ipv4, LinkType::Ipv6] {
            assert_eq!(link_payload(link, &[]), None);
        }
    }

    #[test]
    fn timestamp_conversion_saturates() {
        assert_eq!(ts_to_ns(5, TsResol::Decimal(0), 0), 5_000_000_000);
        assert_eq!(ts_to_ns(5, TsResol::Decimal(12), 0), 0);
        assert_eq!(ts_to_ns(5_000, TsResol::Decimal(12), 0), 5);
        assert_eq!(ts_to_ns(u64::MAX, TsResol::Decimal(127), 0), 0);
        assert_eq!(ts_to_ns(u64::MAX, TsResol::Decimal(0), 0), u64::MAX);
        assert_eq!(ts_to_ns(u64::MAX, TsResol::Binary(127), i64::MAX), u64::MAX);
        assert_eq!(ts_to_ns(1, TsResol::Binary(0), -10), 0);
        assert_eq!(ts_to_ns(3, TsResol::Binary(1), 0), 1_500_000_000);
    }

    fn drain(bytes: &[u8]) {
        if let Ok(reader) = CaptureReader::new(Cursor::new(bytes)) {
            for rec in reader.take(1000) {
                match rec {
                    Ok(rec) => {
                        assert!(rec.data.len() <= MAX_RECORD_LEN as usize);
                        let _ = link_payload(rec.link, &rec.data);
                    }
                    Err(e) => {
                        let _ = e.to_string();
                    }
                }
            }
        }
    }

    fn sample_pcapng() -> Vec<u8> {
        let mut ng = Ng::new();
        ng.shb(false);
        ng.idb(1, 0, &[(OPT_IF_TSRESOL, &[9])]);
        ng.idb(276, 64, &[]);
        ng.epb(0, 77, &eth_frame(ETHERTYPE_IPV4, IPV4), 46);
        ng.epb(1, 78, &[0x86, 0xDD, 0, 0, 0, 0, 0, 0, 0, 0], 10);
        ng.spb(&eth_frame(0x0806, &[0; 28]), 42);
        ng.block(5, &[0; 20]);
        ng.shb(true);
        ng.idb(0, 0, &[(OPT_IF_TSRESOL, &[0x83])]);
        ng.epb(0, 79, &[2, 0, 0, 0, 0x45], 5);
        ng.out
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            drain(&bytes);
        }

        #[test]
        fn random_bodies_behind_valid_magic_never_panic(
            which in 0usize..7,
            tail in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let mut bytes = match which {
                0 => vec![0xD4, 0xC3, 0xB2, 0xA1, 2, 0, 4, 0],
                1 => vec![0xA1, 0xB2, 0xC3, 0xD4, 0, 2, 0, 4],
                2 => vec![0x4D, 0x3C, 0xB2, 0xA1, 2, 0, 4, 0],
                3 => vec![0xA1, 0xB2, 0xCD, 0x34, 0, 2, 0, 4],
                4 => vec![0x0A, 0x0D, 0x0D, 0x0A, 28, 0, 0, 0, 0x4D, 0x3C, 0x2B, 0x1A, 1, 0, 0, 0],
                5 => vec![0x0A, 0x0D, 0x0D, 0x0A, 0, 0, 0, 28, 0x1A, 0x2B, 0x3C, 0x4D, 0, 1, 0, 0],
                _ => Vec::new(),
            };
            bytes.extend_from_slice(&tail);
            drain(&bytes);
        }

        #[test]
        fn mutated_files_never_panic(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in any::<prop::sample::Index>(),
            ng in any::<bool>(),
        ) {
            let mut bytes = if ng {
                sample_pcapng()
            } else {
                let mut w = PcapWriter::new(Vec::new()).unwrap();
                w.write_ip(1, IPV4).unwrap();
                w.write_ip(2, &ipv6()).unwrap();
                w.into_inner().unwrap()
            };
            for (at, byte) in edits {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            bytes.truncate(cut.index(bytes.len() + 1));
            drain(&bytes);
        }
    }

    #[test]
    fn golden_captures_read_to_the_end() {
        let root =
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/golden"));
        if !root.is_dir() {
            eprintln!("skipping: {} does not exist", root.display());
            return;
        }
        let mut files = Vec::new();
        let mut dirs = vec![root.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "pcap") {
                    files.push(path);
                }
            }
        }
        files.sort();
        assert!(!files.is_empty(), "no *.pcap under {}", root.display());
        for path in &files {
            let mut frames = 0u64;
            let file =
                std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let reader = CaptureReader::new(std::io::BufReader::new(file)).unwrap();
            for rec in reader {
                let rec = rec.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                frames += 1;
                assert_eq!(rec.frame, frames);
                assert!(
                    link_payload(rec.link, &rec.data).is_some(),
                    "{} frame {}: no network layer",
                    path.display(),
                    rec.frame
                );
            }
            assert!(frames > 0, "{}: no frames", path.display());
            eprintln!("{}: {frames} frames", path.display());
        }
    }
}
