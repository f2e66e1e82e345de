//! What a program sees of roxe's devices under `roxe run`: the files the
//! kernel would show for an RDMA device (`/sys/class/infiniband/<dev>/`,
//! `/sys/class/infiniband_verbs/uverbs<N>/`, `/dev/infiniband/uverbs<N>`,
//! `/dev/infiniband/rdma_cm`), as a list of entries to create. Pure: the
//! namespace code puts them in place.

use std::net::IpAddr;

/// One device as the view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewDevice {
    /// `roxe0`, ...
    pub name: String,
    /// Its `uverbs<N>` number.
    pub uverbs: u32,
    /// Its address; `None` when it takes the first free one at open.
    pub addr: Option<IpAddr>,
    /// The interface that holds (or whose subnet holds) the address.
    pub netdev: String,
    /// The node GUID.
    pub guid: u64,
}

/// What to create, under `/sys/class` or `/dev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir,
    File(String),
    /// A character device (a bind mount of `/dev/null`: programs check
    /// that the node exists and is a character device; nothing opens it).
    CharDevice,
}

/// Entries of the view, paths relative to the root they go under.
#[derive(Debug, Default)]
pub struct View {
    /// Under `/sys/class`.
    pub sys_class: Vec<(String, Node)>,
    /// Under `/dev`.
    pub dev: Vec<(String, Node)>,
}

/// Entries in the GID table a view shows (as roxe's `gid_tbl_len`).
const GID_TABLE_LEN: u32 = 16;

/// The RoCEv2 GID of an address, as sysfs prints it (`0000:...:0001`).
pub fn gid_text(gid: [u8; 16]) -> String {
    gid.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// A GUID as sysfs prints it (`xxxx:xxxx:xxxx:xxxx`).
pub fn guid_text(guid: u64) -> String {
    let b = guid.to_be_bytes();
    b.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// The view of `devices`.
pub fn view(devices: &[ViewDevice]) -> View {
    let mut v = View::default();
    let mut sys = |p: String, n: Node| v.sys_class.push((p, n));
    sys("infiniband".into(), Node::Dir);
    sys("infiniband_verbs".into(), Node::Dir);
    for d in devices {
        let base = format!("infiniband/{}", d.name);
        let file = |rel: &str, text: String| (format!("{base}/{rel}"), Node::File(text + "\n"));
        let dir = |rel: &str| (format!("{base}/{rel}"), Node::Dir);
        let mut e = vec![
            (base.clone(), Node::Dir),
            file("node_type", "1: CA".into()),
            file("node_guid", guid_text(d.guid)),
            file("sys_image_guid", guid_text(d.guid)),
            file(
                "node_desc",
                format!("roxe {}", d.addr.map_or("auto".into(), |a| a.to_string())),
            ),
            // As ibv_query_device reports it.
            file("fw_ver", env!("CARGO_PKG_VERSION").into()),
            file("hca_type", "roxe".into()),
            file("board_id", "roxe".into()),
            dir("device"),
            file("device/numa_node", "-1".into()),
            file("device/vendor", "0x0000".into()),
            file("device/device", "0x0000".into()),
            dir("device/net"),
            dir(&format!("device/net/{}", d.netdev)),
            dir("ports"),
            dir("ports/1"),
            file("ports/1/state", "4: ACTIVE".into()),
            file("ports/1/phys_state", "5: LinkUp".into()),
            file("ports/1/rate", "100 Gb/sec (4X EDR)".into()),
            file("ports/1/link_layer", "Ethernet".into()),
            file("ports/1/lid", "0x0".into()),
            file("ports/1/sm_lid", "0x0".into()),
            file("ports/1/lid_mask_count", "0".into()),
            file("ports/1/sm_sl", "0".into()),
            file("ports/1/cap_mask", "0x00010000".into()),
            dir("ports/1/pkeys"),
            file("ports/1/pkeys/0", "0xffff".into()),
            dir("ports/1/gids"),
            dir("ports/1/gid_attrs"),
            dir("ports/1/gid_attrs/types"),
            dir("ports/1/gid_attrs/ndevs"),
        ];
        // Index 0 as roxe always had it, index 1 as rxe puts the IPv4 GID
        // there (programs written for rxe use 1); the rest are empty.
        let gid = d.addr.map(roxe_provider::engine::gid_of);
        for i in 0..GID_TABLE_LEN {
            let g = gid.filter(|_| i < 2);
            e.push(file(
                &format!("ports/1/gids/{i}"),
                gid_text(g.unwrap_or([0; 16])),
            ));
            // As the kernel's: the attributes of an empty entry do not read.
            if g.is_some() || (d.addr.is_none() && i < 2) {
                e.push(file(
                    &format!("ports/1/gid_attrs/types/{i}"),
                    "RoCE v2".into(),
                ));
                e.push(file(
                    &format!("ports/1/gid_attrs/ndevs/{i}"),
                    d.netdev.clone(),
                ));
            }
        }
        v.sys_class.extend(e);
        let uv = format!("infiniband_verbs/uverbs{}", d.uverbs);
        v.sys_class.push((uv.clone(), Node::Dir));
        v.sys_class
            .push((format!("{uv}/ibdev"), Node::File(format!("{}\n", d.name))));
        v.sys_class
            .push((format!("{uv}/abi_version"), Node::File("1\n".into())));
        v.sys_class.push((
            format!("{uv}/dev"),
            Node::File(format!("231:{}\n", 192 + d.uverbs)),
        ));
        v.dev
            .push((format!("infiniband/uverbs{}", d.uverbs), Node::CharDevice));
    }
    v.sys_class.push((
        "infiniband_verbs/abi_version".into(),
        Node::File("6\n".into()),
    ));
    v.dev.insert(0, ("infiniband".into(), Node::Dir));
    v.dev.push(("infiniband/rdma_cm".into(), Node::CharDevice));
    v
}

/// Write `view` under `root` (`<root>/sys/class/...`, `<root>/dev/...`) for
/// the preload view: files and directories as they are, character devices
/// as symbolic links to `/dev/null` (what `stat` shows is what programs
/// check), and the host's own entries of the `infiniband*` directories as
/// links to them (absolute, so they resolve from anywhere).
pub fn write_to(view: &View, root: &std::path::Path) -> std::io::Result<()> {
    use std::fs;
    use std::os::unix::fs::symlink;
    for (base, entries) in [("sys/class", &view.sys_class), ("dev", &view.dev)] {
        let under = root.join(base);
        fs::create_dir_all(&under)?;
        for (rel, node) in entries.iter() {
            let p = under.join(rel);
            match node {
                Node::Dir => fs::create_dir_all(&p)?,
                Node::File(text) => fs::write(&p, text)?,
                Node::CharDevice => {
                    let _ = fs::remove_file(&p);
                    symlink("/dev/null", &p)?;
                }
            }
        }
        // The host's entries beside roxe's.
        for dir in ["infiniband", "infiniband_verbs"] {
            let real = std::path::Path::new("/").join(base).join(dir);
            let Ok(rd) = fs::read_dir(&real) else {
                continue;
            };
            for e in rd.flatten() {
                let dst = under.join(dir).join(e.file_name());
                if dst.exists() {
                    continue;
                }
                let target = e.path().canonicalize().unwrap_or_else(|_| e.path());
                symlink(target, dst)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(addr: Option<&str>) -> ViewDevice {
        ViewDevice {
            name: "roxe0".into(),
            uverbs: 2,
            addr: addr.map(|a| a.parse().unwrap()),
            netdev: "lo".into(),
            guid: 0x0000_7f00_fffe_0001,
        }
    }

    fn file<'a>(v: &'a [(String, Node)], path: &str) -> Option<&'a str> {
        v.iter()
            .find(|(p, _)| p == path)
            .and_then(|(_, n)| match n {
                Node::File(t) => Some(t.as_str()),
                _ => None,
            })
    }

    #[test]
    fn a_device_shows_as_the_kernel_shows_rxe() {
        let v = view(&[dev(Some("127.0.0.1"))]);
        let s = &v.sys_class;
        assert_eq!(file(s, "infiniband/roxe0/node_type"), Some("1: CA\n"));
        assert_eq!(
            file(s, "infiniband/roxe0/ports/1/gids/1"),
            Some("0000:0000:0000:0000:0000:ffff:7f00:0001\n")
        );
        assert_eq!(
            file(s, "infiniband/roxe0/ports/1/gids/0"),
            file(s, "infiniband/roxe0/ports/1/gids/1")
        );
        assert_eq!(
            file(s, "infiniband/roxe0/ports/1/gid_attrs/types/1"),
            Some("RoCE v2\n")
        );
        assert_eq!(
            file(s, "infiniband/roxe0/ports/1/gid_attrs/ndevs/0"),
            Some("lo\n")
        );
        assert_eq!(file(s, "infiniband/roxe0/ports/1/gid_attrs/types/2"), None);
        assert_eq!(
            file(s, "infiniband/roxe0/ports/1/gids/2"),
            Some("0000:0000:0000:0000:0000:0000:0000:0000\n")
        );
        assert_eq!(
            file(s, "infiniband/roxe0/ports/1/state"),
            Some("4: ACTIVE\n")
        );
        assert_eq!(
            file(s, "infiniband/roxe0/ports/1/link_layer"),
            Some("Ethernet\n")
        );
        assert_eq!(
            file(s, "infiniband/roxe0/node_guid"),
            Some("0000:7f00:fffe:0001\n")
        );
        assert!(s.contains(&("infiniband/roxe0/device/net/lo".into(), Node::Dir)));
        assert_eq!(file(s, "infiniband_verbs/uverbs2/ibdev"), Some("roxe0\n"));
        assert!(v
            .dev
            .contains(&("infiniband/uverbs2".into(), Node::CharDevice)));
        assert!(v
            .dev
            .contains(&("infiniband/rdma_cm".into(), Node::CharDevice)));
        // Parents come before children.
        for list in [&v.sys_class, &v.dev] {
            for (k, (p, _)) in list.iter().enumerate() {
                if let Some((parent, _)) = p.rsplit_once('/') {
                    assert!(
                        list[..k]
                            .iter()
                            .any(|(q, n)| q == parent && *n == Node::Dir),
                        "{p} before its directory"
                    );
                }
            }
        }
    }

    #[test]
    fn an_auto_device_has_gid_types_but_no_gid_yet() {
        let v = view(&[dev(None)]);
        let s = &v.sys_class;
        assert_eq!(
            file(s, "infiniband/roxe0/ports/1/gid_attrs/types/0"),
            Some("RoCE v2\n")
        );
        assert_eq!(file(s, "infiniband/roxe0/node_desc"), Some("roxe auto\n"));
    }
}
