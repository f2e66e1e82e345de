//! LIDs of loopback devices: programs that address peers by LID
//! (`is_global = 0`, `ibv_rc_pingpong` without `-g`) reach roxe devices on
//! one host.

use std::net::{IpAddr, Ipv4Addr};

/// The device's LID on loopback: 127.0.x.y gives LID x·256 + y (a unicast
/// LID, 1..=0xBFFF), so LID-addressed programs (`is_global = 0`) can reach
/// roxe devices on one host. Other addresses have no LID (0).
pub fn lid_of(addr: IpAddr) -> u16 {
    match addr {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            let lid = u16::from_be_bytes([o[2], o[3]]);
            if o[0] == 127 && o[1] == 0 && (1..=0xBFFF).contains(&lid) {
                lid
            } else {
                0
            }
        }
        IpAddr::V6(_) => 0,
    }
}

/// The loopback device address a LID names (the inverse of [`lid_of`]).
pub fn addr_of_lid(lid: u16) -> Option<IpAddr> {
    (1..=0xBFFF).contains(&lid).then(|| {
        let [hi, lo] = lid.to_be_bytes();
        IpAddr::V4(Ipv4Addr::new(127, 0, hi, lo))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lids_map_loopback_addresses_both_ways() {
        for (a, lid) in [
            ("127.0.0.1", 1),
            ("127.0.1.0", 256),
            ("127.0.191.255", 0xBFFF),
        ] {
            let a: IpAddr = a.parse().unwrap();
            assert_eq!(lid_of(a), lid);
            assert_eq!(addr_of_lid(lid), Some(a));
        }
        for a in ["127.0.192.0", "127.1.0.1", "10.0.0.1", "::1", "127.0.0.0"] {
            assert_eq!(lid_of(a.parse().unwrap()), 0, "{a}");
        }
        assert_eq!(addr_of_lid(0), None);
        assert_eq!(addr_of_lid(0xC000), None);
    }
}
