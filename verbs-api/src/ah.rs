//! Address handles ([`Ah`], `struct ibv_ah`): where UD sends go.

use crate::{hw, verbs, AddressVector, Errno, Pd, Result, UdDest};
use std::net::IpAddr;
use std::sync::Arc;

/// An address handle (`struct ibv_ah`): a resolved UD destination.
#[derive(Clone)]
pub struct Ah {
    /// The hardware AH (dropped first, before its PD). A soft device keeps
    /// nothing per AH: its UD sends name the destination by address.
    _hw: Option<Arc<hw::HwAh>>,
    _pd: Pd,
    addr: IpAddr,
}

impl Pd {
    /// `ibv_create_ah`: where UD sends go.
    pub fn create_ah(&self, av: &AddressVector) -> Result<Ah> {
        self.inner.imp.dispatch(
            |s| {
                let resolved = s.dev.resolve_av(av).ok_or_else(|| {
                    verbs(
                        "ibv_create_ah",
                        Errno::EINVAL,
                        "RoCE needs a GRH (is_global = 1), except between loopback devices by LID",
                    )
                })?;
                Ok(Ah {
                    _hw: None,
                    _pd: self.clone(),
                    addr: roxe_provider::engine::addr_of_gid(resolved.dgid),
                })
            },
            |h| {
                let ah = h.create_ah(av)?;
                Ok(Ah {
                    addr: ah.addr,
                    _hw: Some(ah),
                    _pd: self.clone(),
                })
            },
        )
    }
}

impl Ah {
    /// The destination device's address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }
    /// The `wr.ud` of a send to QP `remote_qpn` with `remote_qkey`.
    pub fn dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest {
            addr: self.addr,
            remote_qpn,
            remote_qkey,
        }
    }
}
