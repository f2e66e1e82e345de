//! `roxe devices` and `roxe devinfo`: what `ibv_devices` and `ibv_devinfo`
//! print, for roxe's soft devices.

use roxe_verbs::{devices, hardware_devices, Backend, Context, Mtu};
use std::process::ExitCode;

/// The device a tool runs on: `-d NAME` among what [`devices`] offers
/// (soft or hardware), else the first; `-x GID_INDEX` overrides the GID
/// index its endpoints carry (hardware: the first RoCEv2 IPv4 GID by
/// default).
pub fn open_device(name: Option<&str>, gid_index: Option<u8>) -> Result<Context, String> {
    let list = devices().map_err(|e| format!("listing devices: {e}"))?;
    let info = match name {
        Some(n) => list.into_iter().find(|d| d.name() == n).ok_or_else(|| {
            format!("no device {n} (roxe devices lists what ROXE_BACKEND offers)")
        })?,
        None => list.into_iter().next().ok_or("no RDMA device")?,
    };
    let ctx = info
        .open()
        .map_err(|e| format!("opening {}: {e}", info.name()))?;
    if let Some(g) = gid_index {
        ctx.set_default_gid_index(g)
            .map_err(|e| format!("{}: GID index {g}: {e}", info.name()))?;
    }
    Ok(ctx)
}

/// `roxe devices`: the devices `ROXE_BACKEND` offers, with their backend;
/// when no hardware device is listed, one line says why.
pub fn run_devices() -> ExitCode {
    let list = match devices() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("roxe devices: {e}");
            return ExitCode::from(1);
        }
    };
    println!(
        "    {:<16}\t   {:<16}\t{:<8}\taddress",
        "device", "node GUID", "backend"
    );
    println!(
        "    {:<16}\t{:<16}\t{:<8}\t-------",
        "------", "----------------", "-------"
    );
    for d in &list {
        let (backend, addr) = match d.backend() {
            Backend::Soft => (
                "soft",
                d.addr()
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| "auto (first free 127.0.0.N)".into()),
            ),
            Backend::Hardware => ("hardware", "-".into()),
        };
        println!(
            "    {:<16}\t{:016x}\t{backend:<8}\t{addr}",
            d.name(),
            d.guid()
        );
    }
    if !list.iter().any(|d| d.backend() == Backend::Hardware) {
        match (hardware_devices(), roxe_verbs::hw::system()) {
            (Err(why), _) => println!("hardware: none ({why})"),
            (Ok(h), Ok(sys)) if h.is_empty() => println!(
                "hardware: none ({} lists no RDMA device)",
                sys.path().display()
            ),
            // Listed by the library but not offered: ROXE_BACKEND=soft.
            (Ok(h), _) => println!(
                "hardware: {} device(s) not offered (ROXE_BACKEND=soft)",
                h.len()
            ),
        }
    }
    ExitCode::SUCCESS
}

/// Arguments of `roxe devinfo`.
#[derive(clap::Args, Debug)]
pub struct DevinfoArgs {
    /// Only this device (e.g. roxe0).
    #[arg(short = 'd', long = "ib-dev")]
    device: Option<String>,
    /// Also print limits (like ibv_devinfo -v).
    #[arg(short, long)]
    verbose: bool,
}

fn mtu_str(m: Mtu) -> &'static str {
    match m {
        Mtu::Mtu256 => "256",
        Mtu::Mtu512 => "512",
        Mtu::Mtu1024 => "1024",
        Mtu::Mtu2048 => "2048",
        Mtu::Mtu4096 => "4096",
    }
}

fn gid_str(g: &[u8; 16]) -> String {
    g.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

fn guid_str(g: u64) -> String {
    let b = g.to_be_bytes();
    b.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// `roxe devinfo`: opens each device (binding its address) and prints its
/// attributes, port and GID table.
pub fn run_devinfo(args: &DevinfoArgs) -> ExitCode {
    let list = match devices() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("roxe devinfo: {e}");
            return ExitCode::from(1);
        }
    };
    let mut shown = 0;
    for d in list {
        if args.device.as_deref().is_some_and(|n| n != d.name()) {
            continue;
        }
        let ctx = match d.open() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("roxe devinfo: {}: {e}", d.name());
                return ExitCode::from(1);
            }
        };
        shown += 1;
        let a = ctx.query_device();
        println!("hca_id:\t{}", ctx.name());
        println!("\ttransport:\t\t\tInfiniBand (0)");
        match ctx.backend() {
            Backend::Soft => println!("\tfw_ver:\t\t\t\t0.1.0 (roxe soft RoCEv2)"),
            Backend::Hardware => println!("\tbackend:\t\t\thardware (system libibverbs)"),
        }
        println!("\tnode_guid:\t\t\t{}", guid_str(a.node_guid));
        println!("\tsys_image_guid:\t\t\t{}", guid_str(a.node_guid));
        println!("\tvendor_id:\t\t\t0x{:04x}", a.vendor_id);
        println!("\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
        if args.verbose {
            println!("\tmax_mr_size:\t\t\t0x{:x}", a.max_mr_size);
            println!("\tmax_qp:\t\t\t\t{}", a.max_qp);
            println!("\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
            println!("\tmax_sge:\t\t\t{}", a.max_sge);
            println!("\tmax_cq:\t\t\t\t{}", a.max_cq);
            println!("\tmax_cqe:\t\t\t{}", a.max_cqe);
            println!("\tmax_mr:\t\t\t\t{}", a.max_mr);
            println!("\tmax_pd:\t\t\t\t{}", a.max_pd);
            println!("\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
            println!("\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
            println!("\tmax_srq:\t\t\t{}", a.max_srq);
            println!("\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
            println!("\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
            println!("\tmax_inline_data:\t\t{}", a.max_inline_data);
            println!("\tmax_pkeys:\t\t\t{}", a.max_pkeys);
        }
        let p = match ctx.query_port(1) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("roxe devinfo: {e}");
                return ExitCode::from(1);
            }
        };
        println!("\t\tport:\t1");
        println!("\t\t\tstate:\t\t\tPORT_ACTIVE ({})", p.state);
        println!(
            "\t\t\tmax_mtu:\t\t{} ({})",
            mtu_str(p.max_mtu),
            p.max_mtu as u8
        );
        println!(
            "\t\t\tactive_mtu:\t\t{} ({})",
            mtu_str(p.active_mtu),
            p.active_mtu as u8
        );
        println!("\t\t\tsm_lid:\t\t\t0");
        println!("\t\t\tport_lid:\t\t{}", p.lid);
        println!("\t\t\tport_lmc:\t\t0x00");
        println!("\t\t\tlink_layer:\t\tEthernet");
        if args.verbose {
            println!("\t\t\tmax_msg_sz:\t\t0x{:x}", p.max_msg_sz);
            println!("\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
            println!("\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
            for i in 0..p.gid_tbl_len.min(256) {
                match ctx.query_gid(1, i) {
                    Ok(g) if g != [0; 16] => println!(
                        "\t\t\tGID[{i:>3}]:\t\t{}{}",
                        gid_str(&g),
                        if i == u32::from(ctx.default_gid_index()) {
                            format!(", default ({})", ctx.addr())
                        } else {
                            String::new()
                        }
                    ),
                    _ => {}
                }
            }
        }
        println!();
    }
    if shown == 0 {
        eprintln!("roxe devinfo: no such device");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
