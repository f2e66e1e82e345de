//! Helpers shared by the verbs API's integration tests.
// Each test crate includes this module and uses part of it.
#![allow(dead_code)]

use roxe_verbs::*;

/// Open soft device `name` on a loopback address of its own
/// (`roxe_testnet`: no other test holds it).
pub fn open(name: &str) -> Context {
    open_with(name, DeviceConfig::default())
}

/// [`open`] with the rest of the configuration from `base`.
pub fn open_with(name: &str, base: DeviceConfig) -> Context {
    let addr = roxe_testnet::addr();
    eprintln!("{name}: {addr}");
    let config = DeviceConfig {
        addr: Some(addr.into()),
        ..base
    };
    device_with(name, config)
        .open()
        .expect("open a soft device")
}

/// An RC QP on a soft device of its own, with its CQ (on a completion
/// channel), PD and one MR.
pub struct Side {
    pub ctx: Context,
    pub qp: Qp,
    pub cq: Cq,
    pub mr: Mr,
    pub channel: CompChannel,
    pub _pd: Pd,
}

/// What a [`Side`] is made of.
pub struct SideShape {
    pub cq_depth: u32,
    /// Both work queues' depth.
    pub max_wr: u32,
    pub mr_len: usize,
    pub access: AccessFlags,
}

/// A [`Side`] on soft device `name` (its own address), the rest of its
/// configuration from `base`.
pub fn side(name: &str, base: DeviceConfig, shape: &SideShape) -> Side {
    let ctx = open_with(name, base);
    let pd = ctx.alloc_pd().unwrap();
    let channel = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(shape.cq_depth, Some(&channel)).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq, &cq);
    init.cap.max_send_wr = shape.max_wr;
    init.cap.max_recv_wr = shape.max_wr;
    let qp = pd.create_qp(&init).unwrap();
    let mr = pd.reg_mr(shape.mr_len, shape.access).unwrap();
    Side {
        ctx,
        qp,
        cq,
        mr,
        channel,
        _pd: pd,
    }
}

/// Connect `a`'s and `b`'s QPs to each other (PSNs 1 and 2, MTU 4096,
/// ACK timeout exponent `timeout`).
pub fn connect_sides(a: &Side, b: &Side, access: AccessFlags, timeout: u8) {
    a.qp.connect(1, &b.qp.endpoint(2), Mtu::Mtu4096, access, timeout)
        .unwrap();
    b.qp.connect(2, &a.qp.endpoint(1), Mtu::Mtu4096, access, timeout)
        .unwrap();
}
