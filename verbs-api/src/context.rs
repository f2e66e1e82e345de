//! An open device ([`Context`], `struct ibv_context`) and what it answers
//! about itself: [`DeviceAttr`], [`PortAttr`], GIDs, [`TmCaps`]. The
//! objects it makes are in their own modules (`Context::alloc_pd` in
//! `pd.rs`, `Context::create_cq` in `cq.rs`, ...).

use crate::backend::Backed;
use crate::device::guid_of;
use crate::{hw, verbs, Backend, DeviceStats, Errno, Mtu, Result};
use roxe_provider::driver::Device;
use std::net::IpAddr;
use std::sync::Arc;

/// Entries in a soft device's GID table (`gid_tbl_len`): indexes 0 and 1
/// hold its address's GID, the others are empty, as unused entries of
/// rxe's.
pub const SOFT_GID_TABLE_LEN: u32 = 16;

/// An open device (`struct ibv_context`).
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    name: String,
    /// What serves the device: roxe's engine or the system library.
    pub(crate) imp: Backed<Arc<Device>, Arc<hw::HwContext>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.inner.name)
            .field("backend", &self.backend())
            .field("addr", &self.addr())
            .finish()
    }
}

/// `struct ibv_device_attr`, the fields programs read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceAttr {
    /// Firmware version string's numbers.
    pub fw_ver: u64,
    /// Node GUID.
    pub node_guid: u64,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Supported page sizes.
    pub page_size_cap: u64,
    /// Vendor id (0: soft).
    pub vendor_id: u32,
    /// Largest QP count.
    pub max_qp: u32,
    /// Largest WR count per queue.
    pub max_qp_wr: u32,
    /// Largest SGE count per WR.
    pub max_sge: u32,
    /// Largest CQ count.
    pub max_cq: u32,
    /// Largest CQ depth.
    pub max_cqe: u32,
    /// Largest MR count.
    pub max_mr: u32,
    /// Largest PD count.
    pub max_pd: u32,
    /// Outstanding READ/atomics a QP accepts.
    pub max_qp_rd_atom: u32,
    /// Outstanding READ/atomics a QP issues.
    pub max_qp_init_rd_atom: u32,
    /// Largest SRQ count.
    pub max_srq: u32,
    /// Largest SRQ depth.
    pub max_srq_wr: u32,
    /// Largest SGE count per SRQ WR.
    pub max_srq_sge: u32,
    /// Largest inline data.
    pub max_inline_data: u32,
    /// Partition keys.
    pub max_pkeys: u16,
    /// Physical ports.
    pub phys_port_cnt: u8,
}

/// `struct ibv_tm_caps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TmCaps {
    /// Largest rendezvous message (TMH, RVH and any user header).
    pub max_rndv_hdr_size: u32,
    /// Largest tag list.
    pub max_num_tags: u32,
    /// Tag-list operations outstanding at once.
    pub max_ops: u32,
    /// SGEs per tagged buffer.
    pub max_sge: u32,
    /// `IBV_TM_CAP_RC`: tag matching on RC QPs.
    pub rc: bool,
}

/// `struct ibv_port_attr`, the fields programs read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// Always ACTIVE (4).
    pub state: u8,
    /// Largest MTU.
    pub max_mtu: Mtu,
    /// Active MTU.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// LID (loopback devices only; 0 otherwise).
    pub lid: u16,
    /// `IBV_LINK_LAYER_ETHERNET` (2).
    pub link_layer: u8,
    /// Largest message.
    pub max_msg_sz: u32,
}

impl Context {
    /// The context of the device `name`, served by `imp`.
    pub(crate) fn new(name: String, imp: Backed<Arc<Device>, Arc<hw::HwContext>>) -> Context {
        Context {
            inner: Arc::new(ContextInner { name, imp }),
        }
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// A soft device's counters (`None` on hardware: see the device's
    /// `hw_counters` in sysfs).
    pub fn stats(&self) -> Option<DeviceStats> {
        self.soft_device().map(Device::stats)
    }
    /// The backend serving this context.
    pub fn backend(&self) -> Backend {
        self.inner.imp.backend()
    }
    /// The soft device underneath (counters, address, CM); `None` on the
    /// hardware backend.
    pub fn soft_device(&self) -> Option<&Device> {
        self.inner.imp.soft().map(|d| &**d)
    }
    /// The soft device, or EOPNOTSUPP naming `verb` on hardware.
    pub(crate) fn soft(&self, verb: &'static str) -> Result<&Device> {
        self.soft_arc(verb).map(|d| &**d)
    }
    /// As [`Context::soft`], the shared handle.
    pub(crate) fn soft_arc(&self, verb: &'static str) -> Result<&Arc<Device>> {
        self.inner.imp.soft().ok_or_else(|| {
            verbs(
                verb,
                Errno::EOPNOTSUPP,
                format!(
                    "{} is a hardware device; {verb} runs on soft devices",
                    self.name()
                ),
            )
        })
    }
    /// The device's address: a soft device's own; on hardware, the
    /// address in the default GID ([`Context::default_gid_index`]).
    pub fn addr(&self) -> IpAddr {
        self.inner.imp.dispatch(
            |d| d.addr(),
            |h| {
                h.query_gid(1, u32::from(h.gid_index()))
                    .map(roxe_provider::engine::addr_of_gid)
                    .unwrap_or(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED))
            },
        )
    }
    /// The GID index [`Qp::endpoint`](crate::Qp::endpoint) and
    /// [`Qp::connect`](crate::Qp::connect) use: 0 on a soft device; on
    /// hardware, the first RoCEv2 GID holding an IPv4 address (as rdma_cm
    /// picks for IPv4), else the first RoCEv2 GID.
    pub fn default_gid_index(&self) -> u8 {
        self.inner.imp.dispatch(|_| 0, |h| h.gid_index())
    }
    /// Choose another GID index for [`Qp::endpoint`](crate::Qp::endpoint)
    /// and [`Qp::connect`](crate::Qp::connect) (`-g` of the pingpong
    /// programs); EINVAL where the port has no such GID. A soft device
    /// keeps using index 0, which holds the same GID as index 1.
    pub fn set_default_gid_index(&self, index: u8) -> Result<()> {
        let gid = self.query_gid(1, u32::from(index))?;
        self.inner.imp.dispatch(
            |_| Ok(()),
            |h| {
                if gid == [0; 16] {
                    return Err(verbs(
                        "ibv_query_gid",
                        Errno::EINVAL,
                        format!("GID index {index} is empty"),
                    ));
                }
                h.set_gid_index(index);
                Ok(())
            },
        )
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        self.inner.imp.dispatch(|d| soft_device_attr(d), |h| h.attr)
    }

    /// Tag matching's limits (`ibv_device_attr_ex.tm_caps`): what
    /// [`Pd::create_tm_srq`](crate::Pd::create_tm_srq) accepts. All zero
    /// on a hardware device (tag matching through the Rust API is
    /// soft-only).
    pub fn tm_caps(&self) -> TmCaps {
        self.inner.imp.dispatch(
            |d| {
                let e = d.engine();
                let c = e.config();
                TmCaps {
                    max_rndv_hdr_size: roxe_provider::engine::MAX_RNDV_HDR,
                    max_num_tags: c.max_tm_tags,
                    // Operations execute as they are posted.
                    max_ops: c.max_qp_wr,
                    max_sge: c.max_sge,
                    rc: true,
                }
            },
            |_| TmCaps::default(),
        )
    }

    /// `ibv_query_port` (port 1 on a soft device).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.inner
            .imp
            .dispatch(|d| soft_port_attr(d, port), |h| h.port_attr(port))
    }

    /// `ibv_query_gid`: on a soft device, indexes 0 and 1 hold the RoCEv2
    /// GID of the device's address (1 is where rxe lists the IPv4 GID, so
    /// programs written for rxe find it there); the rest of its table (as
    /// rxe's, room for more addresses) is empty: ENODATA.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<[u8; 16]> {
        self.inner.imp.dispatch(
            |d| match (port, index) {
                (1, 0 | 1) => Ok(d.gid()),
                (1, i) if i < SOFT_GID_TABLE_LEN => Err(verbs(
                    "ibv_query_gid",
                    Errno::ENODATA,
                    format!("GID index {i} is empty"),
                )),
                _ => Err(verbs(
                    "ibv_query_gid",
                    Errno::EINVAL,
                    format!("no GID {index} on port {port}"),
                )),
            },
            |h| h.query_gid(port, index),
        )
    }
}

/// A soft device's `ibv_query_device`: its engine's limits.
fn soft_device_attr(d: &Device) -> DeviceAttr {
    let e = d.engine();
    let c = e.config();
    DeviceAttr {
        fw_ver: 0,
        node_guid: guid_of(d.addr()),
        max_mr_size: u64::MAX,
        page_size_cap: 0xffff_f000,
        vendor_id: 0xffffff,
        max_qp: 0x10000,
        max_qp_wr: c.max_qp_wr,
        max_sge: c.max_sge,
        max_cq: 0x10000,
        max_cqe: c.max_cqe,
        max_mr: roxe_provider::memory::MAX_REGIONS,
        max_pd: 0x10000,
        max_qp_rd_atom: u32::from(c.qp_limits.max_qp_rd_atom),
        max_qp_init_rd_atom: u32::from(c.qp_limits.max_qp_init_rd_atom),
        max_srq: 0x10000,
        max_srq_wr: c.max_qp_wr,
        max_srq_sge: c.max_sge,
        max_inline_data: c.max_inline,
        max_pkeys: c.qp_limits.pkey_table_len,
        phys_port_cnt: c.qp_limits.port_count,
    }
}

/// A soft device's `ibv_query_port`: its one port, always active.
fn soft_port_attr(d: &Device, port: u8) -> Result<PortAttr> {
    if port != 1 {
        return Err(verbs(
            "ibv_query_port",
            Errno::EINVAL,
            format!("no port {port}"),
        ));
    }
    Ok(PortAttr {
        state: 4,
        max_mtu: Mtu::Mtu4096,
        // From the link the address is on, as rxe's from its netdev.
        active_mtu: d.engine().config().active_mtu,
        gid_tbl_len: SOFT_GID_TABLE_LEN,
        pkey_tbl_len: 1,
        lid: d.lid(),
        link_layer: 2,
        max_msg_sz: 0x8000_0000,
    })
}
