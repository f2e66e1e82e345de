//! What a received REQ or SIDR_REQ must be before it changes anything: the
//! checks the kernel's `ib_cm` and `rdma_cm` make on the passive side
//! (`cm_req_handler`, `cma_ib_req_handler`: `cma_save_ip_info`,
//! `cma_get_net_dev`/`validate_net_dev`, `cma_check_req_qp_type`), in
//! their order, each with the answer the kernel gives. A request that
//! fails one never reaches a listener and leaves no connection behind.

use roxe_wire::cm::{rdma_cm, reason, ReqRepr, SidrReqRepr, CM_CLASS_VERSION};
use std::net::IpAddr;

/// Why a received MAD was refused before it changed any state (counted
/// in [`super::CmStats::refused`], shown by `roxe stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not CM class version 2 (the kernel's MAD layer has no agent for
    /// another version: dropped).
    ClassVersion,
    /// Transport service type RD or reserved.
    TransportType,
    /// The requester names QP 0 or 1, which are never connected.
    SpecialQpn,
    /// A path MTU outside 256 .. 4096.
    PathMtu,
    /// The path's GID for this end is not this device's (`ib_cm`: REJ
    /// invalid GID).
    ReceiverGid,
    /// The path's GID for the requester is not the packet's source.
    SenderGid,
    /// An rdma_cm service ID without a CMA header of version 0 and IP
    /// version 4 or 6 (`cma_save_ip_info`).
    CmaHeader,
    /// CMA header addresses of the other IP version than the device's.
    IpVersion,
    /// The CMA header's destination is not this device's address
    /// (`validate_net_dev`).
    Destination,
    /// The CMA header's source is not the packet's source.
    Source,
    /// A request its port space does not take: a REQ to the UDP or IPoIB
    /// port space, a SIDR_REQ to TCP's, an RC REQ that is not RC
    /// (`cma_check_req_qp_type`).
    QpType,
}

impl Refusal {
    /// Every reason, in the order of [`RefusalCounts`].
    pub const ALL: [Refusal; 11] = [
        Refusal::ClassVersion,
        Refusal::TransportType,
        Refusal::SpecialQpn,
        Refusal::PathMtu,
        Refusal::ReceiverGid,
        Refusal::SenderGid,
        Refusal::CmaHeader,
        Refusal::IpVersion,
        Refusal::Destination,
        Refusal::Source,
        Refusal::QpType,
    ];

    /// Its name in `roxe stat`.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::ClassVersion => "class_version",
            Refusal::TransportType => "transport_type",
            Refusal::SpecialQpn => "special_qpn",
            Refusal::PathMtu => "path_mtu",
            Refusal::ReceiverGid => "receiver_gid",
            Refusal::SenderGid => "sender_gid",
            Refusal::CmaHeader => "cma_header",
            Refusal::IpVersion => "ip_version",
            Refusal::Destination => "destination",
            Refusal::Source => "source",
            Refusal::QpType => "qp_type",
        }
    }

    /// The REJ reason a refused REQ is answered with: `ib_cm`'s own for
    /// what it checks, "consumer defined" where rdma_cm's handler fails
    /// (the kernel's CM then destroys the request, which rejects it so).
    /// `None`: dropped unanswered.
    pub fn rej_reason(self) -> Option<u16> {
        match self {
            Refusal::ClassVersion => None,
            Refusal::TransportType => Some(reason::INVALID_TRANSPORT_TYPE),
            Refusal::PathMtu => Some(reason::INVALID_MTU),
            Refusal::ReceiverGid => Some(reason::INVALID_GID),
            Refusal::SpecialQpn
            | Refusal::SenderGid
            | Refusal::CmaHeader
            | Refusal::IpVersion
            | Refusal::Destination
            | Refusal::Source
            | Refusal::QpType => Some(reason::CONSUMER_DEFINED),
        }
    }

    fn index(self) -> usize {
        Refusal::ALL
            .iter()
            .position(|r| *r == self)
            .unwrap_or_default()
    }
}

/// Refused MADs by [`Refusal`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefusalCounts([u64; Refusal::ALL.len()]);

impl RefusalCounts {
    pub(super) fn count(&mut self, r: Refusal) {
        self.0[r.index()] += 1;
    }

    /// How many were refused for `r`.
    pub fn get(&self, r: Refusal) -> u64 {
        self.0[r.index()]
    }

    /// All refused.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// `(name, count)` of each reason with a count.
    pub fn nonzero(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Refusal::ALL
            .iter()
            .map(|r| (r.name(), self.get(*r)))
            .filter(|(_, n)| *n > 0)
    }
}

/// The RoCEv2 GID of an address (IPv4: `::ffff:a.b.c.d`).
pub(super) fn gid_of(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The MAD header's class version.
pub(super) fn check_class_version(class_version: u8) -> Result<(), Refusal> {
    if class_version == CM_CLASS_VERSION {
        Ok(())
    } else {
        Err(Refusal::ClassVersion)
    }
}

/// A REQ from `from` to a listener of this device (at `local`, when the
/// CM knows its address), in the kernel's order: `ib_cm`'s transport and
/// path checks, then rdma_cm's for its port spaces.
pub(super) fn check_req(local: Option<IpAddr>, from: IpAddr, req: &ReqRepr) -> Result<(), Refusal> {
    // 0 RC, 1 UC; 2 RD and 3 are not served.
    if req.transport_service_type > 1 {
        return Err(Refusal::TransportType);
    }
    if req.local_qpn <= 1 {
        return Err(Refusal::SpecialQpn);
    }
    if !(1..=5).contains(&req.path_mtu) {
        return Err(Refusal::PathMtu);
    }
    if let Some(local) = local {
        if req.primary.remote_gid != gid_of(local) {
            return Err(Refusal::ReceiverGid);
        }
        if req.primary.local_gid != gid_of(from) {
            return Err(Refusal::SenderGid);
        }
    }
    if let Some((ps, _)) = rdma_cm::port_space_of(req.service_id) {
        check_cma_header(local, from, &req.private_data)?;
        // Connected QPs: RC in TCP's and IB's port spaces (an extended
        // transport, XRC, is not rdma_cm's TCP); UDP and IPoIB are UD,
        // resolved by SIDR.
        let rc = req.transport_service_type == 0 && req.extended_transport == 0;
        match ps {
            rdma_cm::PS_TCP if rc => {}
            rdma_cm::PS_IB if req.transport_service_type == 0 => {}
            _ => return Err(Refusal::QpType),
        }
    }
    Ok(())
}

/// A SIDR_REQ from `from`: rdma_cm's checks for its port spaces.
pub(super) fn check_sidr_req(
    local: Option<IpAddr>,
    from: IpAddr,
    req: &SidrReqRepr,
) -> Result<(), Refusal> {
    if let Some((ps, _)) = rdma_cm::port_space_of(req.service_id) {
        check_cma_header(local, from, &req.private_data)?;
        if ps == rdma_cm::PS_TCP {
            return Err(Refusal::QpType);
        }
    }
    Ok(())
}

/// The CMA header at the start of `private_data`: version 0, IP version 4
/// or 6 and the device's, addressed from the packet's source to this
/// device.
fn check_cma_header(
    local: Option<IpAddr>,
    from: IpAddr,
    private_data: &[u8],
) -> Result<(), Refusal> {
    let hdr = rdma_cm::CmaHeader::parse(private_data).map_err(|_| Refusal::CmaHeader)?;
    let Some(local) = local else {
        return Ok(());
    };
    if hdr.dst.is_ipv4() != local.is_ipv4() || hdr.src.is_ipv4() != from.is_ipv4() {
        return Err(Refusal::IpVersion);
    }
    if hdr.dst != local {
        return Err(Refusal::Destination);
    }
    if hdr.src != from {
        return Err(Refusal::Source);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use roxe_wire::cm::PathRepr;

    const LOCAL: &str = "127.0.0.1";
    const PEER: &str = "127.0.0.2";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn header(src: IpAddr, dst: IpAddr) -> [u8; roxe_wire::cm::REQ_PRIVATE_DATA] {
        let mut pd = [0u8; roxe_wire::cm::REQ_PRIVATE_DATA];
        rdma_cm::CmaHeader {
            cma_version: 0,
            ip_version: if src.is_ipv4() { 4 } else { 6 },
            port: 40000,
            src,
            dst,
        }
        .emit(&mut pd)
        .unwrap();
        pd
    }

    /// A REQ as the kernel's rdma_cm sends it from PEER to LOCAL.
    fn good() -> ReqRepr {
        ReqRepr {
            service_id: rdma_cm::service_id(rdma_cm::PS_TCP, 7174),
            local_qpn: 0x11,
            path_mtu: 5,
            primary: PathRepr {
                local_gid: gid_of(ip(PEER)),
                remote_gid: gid_of(ip(LOCAL)),
                ..PathRepr::default()
            },
            private_data: header(ip(PEER), ip(LOCAL)),
            ..ReqRepr::default()
        }
    }

    fn check(req: &ReqRepr) -> Result<(), Refusal> {
        check_req(Some(ip(LOCAL)), ip(PEER), req)
    }

    #[test]
    fn a_kernel_like_req_passes() {
        assert_eq!(check(&good()), Ok(()));
    }

    #[test]
    fn each_wrong_field_is_refused_for_its_reason() {
        type Spoil = Box<dyn Fn(&mut ReqRepr)>;
        let cases: Vec<(Refusal, Spoil)> = vec![
            (
                Refusal::TransportType,
                Box::new(|r| r.transport_service_type = 2),
            ),
            (Refusal::SpecialQpn, Box::new(|r| r.local_qpn = 1)),
            (Refusal::PathMtu, Box::new(|r| r.path_mtu = 6)),
            (
                Refusal::ReceiverGid,
                Box::new(|r| r.primary.remote_gid = gid_of(ip("127.0.0.9"))),
            ),
            (
                Refusal::SenderGid,
                Box::new(|r| r.primary.local_gid = gid_of(ip("127.0.0.9"))),
            ),
            (Refusal::CmaHeader, Box::new(|r| r.private_data[0] = 1)),
            (Refusal::CmaHeader, Box::new(|r| r.private_data[1] = 0x50)),
            (
                Refusal::Destination,
                Box::new(|r| r.private_data = header(ip(PEER), ip("127.0.0.9"))),
            ),
            (
                Refusal::Source,
                Box::new(|r| r.private_data = header(ip("127.0.0.9"), ip(LOCAL))),
            ),
            (
                Refusal::IpVersion,
                Box::new(|r| r.private_data = header(ip("::1"), ip("::2"))),
            ),
            (Refusal::QpType, Box::new(|r| r.transport_service_type = 1)),
            (
                Refusal::QpType,
                Box::new(|r| r.service_id = rdma_cm::service_id(rdma_cm::PS_UDP, 7174)),
            ),
        ];
        for (want, spoil) in cases {
            let mut r = good();
            spoil(&mut r);
            assert_eq!(check(&r), Err(want), "{want:?}");
        }
    }

    #[test]
    fn a_native_cm_service_needs_no_cma_header() {
        let mut r = good();
        r.service_id = 0x1000_0000_0000_0001;
        r.private_data = [0xAB; roxe_wire::cm::REQ_PRIVATE_DATA];
        assert_eq!(check(&r), Ok(()));
        r.transport_service_type = 1;
        assert_eq!(check(&r), Ok(()), "UC outside rdma_cm's TCP space");
    }

    #[test]
    fn sidr_to_the_tcp_port_space_is_refused() {
        let mut req = SidrReqRepr {
            service_id: rdma_cm::service_id(rdma_cm::PS_UDP, 7174),
            ..SidrReqRepr::default()
        };
        req.private_data[..roxe_wire::cm::REQ_PRIVATE_DATA]
            .copy_from_slice(&header(ip(PEER), ip(LOCAL)));
        assert_eq!(check_sidr_req(Some(ip(LOCAL)), ip(PEER), &req), Ok(()));
        req.service_id = rdma_cm::service_id(rdma_cm::PS_TCP, 7174);
        assert_eq!(
            check_sidr_req(Some(ip(LOCAL)), ip(PEER), &req),
            Err(Refusal::QpType)
        );
        req.private_data[0] = 9;
        assert_eq!(
            check_sidr_req(Some(ip(LOCAL)), ip(PEER), &req),
            Err(Refusal::CmaHeader)
        );
    }

    #[test]
    fn counts_name_their_reasons() {
        let mut c = RefusalCounts::default();
        c.count(Refusal::Destination);
        c.count(Refusal::Destination);
        c.count(Refusal::QpType);
        assert_eq!(c.total(), 3);
        let v: Vec<_> = c.nonzero().collect();
        assert_eq!(v, [("destination", 2), ("qp_type", 1)]);
    }
}
