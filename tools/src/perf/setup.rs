//! The verbs resources of one side of `roxe perf`: its device's PD, CQ,
//! MR and QPs, and connecting the QPs to the peer's.

use super::args::{mtu_of, Args, Op, Params};
use super::ctrl::RemoteMr;
use super::Res;
use roxe_verbs::{AccessFlags, CompChannel, Cq, Endpoint, Mr, Pd, Qp, QpInit, QpType, RecvWr};

/// One side's resources, for one run.
pub struct Setup {
    // Field order is drop order: QPs before the MR, CQ and PD they use.
    pub qps: Vec<Qp>,
    pub psns: Vec<u32>,
    pub mr: Mr,
    pub cq: Cq,
    pub channel: Option<CompChannel>,
    _pd: Pd,
    pub addr: std::net::IpAddr,
    /// A hardware device: nothing in this process needs the core, so a
    /// loop polling memory spins without yielding (as perftest does).
    pub hardware: bool,
    /// The most READs and atomics outstanding a QP of the device may have
    /// each way (`max_qp_init_rd_atom`, `max_qp_rd_atom`).
    pub max_outs: u8,
}

const ACCESS: AccessFlags = AccessFlags(
    AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_READ.0,
);

/// Open the device (`-d`, `-x`) and make the resources run `p` needs.
pub fn setup(p: &Params, event: bool, args: &Args) -> Res<Setup> {
    let dev = crate::info::open_device(args.ib_dev.as_deref(), args.gid_index)?;
    let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
    let cqe = p.qps * (p.tx_depth + p.rx_depth) + 16;
    let channel = if event {
        Some(dev.create_comp_channel().map_err(|e| e.to_string())?)
    } else {
        None
    };
    let cq = dev
        .create_cq(cqe, channel.as_ref())
        .map_err(|e| e.to_string())?;
    // Write latency by buffer polling: the peer writes the first SIZE bytes,
    // this side sends from the next SIZE.
    let halves = if p.lat && p.op == Op::Write { 2 } else { 1 };
    let mr_len = p.size as usize * p.qps.max(halves) as usize;
    let mr = pd.reg_mr(mr_len, ACCESS).map_err(|e| e.to_string())?;
    let seed = seed();
    let mut qps = Vec::new();
    let mut psns = Vec::new();
    for i in 0..p.qps {
        let mut init = QpInit::new(QpType::Rc, &cq, &cq);
        init.cap.max_send_wr = p.tx_depth;
        init.cap.max_recv_wr = p.rx_depth;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = if p.inline() { p.inline_size } else { 0 };
        qps.push(pd.create_qp(&init).map_err(|e| e.to_string())?);
        psns.push(mix(seed ^ u64::from(i)) as u32 & 0xFF_FFFF);
    }
    Ok(Setup {
        qps,
        psns,
        mr,
        cq,
        channel,
        _pd: pd,
        addr: dev.addr(),
        hardware: dev.backend() == roxe_verbs::Backend::Hardware,
        max_outs: {
            let a = dev.query_device();
            a.max_qp_init_rd_atom
                .min(a.max_qp_rd_atom)
                .clamp(1, u32::from(u8::MAX)) as u8
        },
    })
}

fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32)
}

/// splitmix64's finaliser: spreads a seed's bits.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Setup {
    pub fn eps(&self) -> Vec<Endpoint> {
        self.qps
            .iter()
            .zip(&self.psns)
            .map(|(q, &psn)| q.endpoint(psn))
            .collect()
    }
    pub fn remote_mr(&self) -> RemoteMr {
        RemoteMr {
            addr: self.mr.addr(),
            rkey: self.mr.rkey(),
            len: self.mr.len() as u64,
        }
    }
    /// Connect every QP, `outs` READs outstanding each way.
    pub fn connect(&self, p: &Params, remote: &[Endpoint], outs: u8) -> Res<()> {
        if remote.len() != self.qps.len() {
            return Err(format!(
                "the peer sent {} endpoints for {} QPs",
                remote.len(),
                self.qps.len()
            ));
        }
        let mtu = mtu_of(p.mtu)?;
        for ((q, &psn), r) in self.qps.iter().zip(&self.psns).zip(remote) {
            q.connect_with_outstanding(psn, r, mtu, ACCESS, 14, outs)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
    /// A receive into QP `i`'s slice of the MR (`data`: false for a
    /// receive only an immediate consumes).
    pub fn post_recv(&self, p: &Params, i: usize, wr_id: u64, data: bool) -> Res<()> {
        self.qps[i]
            .post_recv(self.recv_wr(p, i, wr_id, data))
            .map_err(|e| e.to_string())
    }

    /// A receive into QP `i`'s slot of the buffer (`data`), or without
    /// memory (WRITE_WITH_IMM).
    pub fn recv_wr(&self, p: &Params, i: usize, wr_id: u64, data: bool) -> RecvWr {
        let sg_list = if data {
            vec![self.mr.sge(i * p.size as usize, p.size)]
        } else {
            Vec::new()
        };
        RecvWr { wr_id, sg_list }
    }
}

/// The bytes an inline WR of this run carries (the first SIZE bytes of the
/// region, as its SGE would), or `None` when payloads are not inline.
pub fn inline_payload(p: &Params, s: &Setup) -> Res<Option<Vec<u8>>> {
    if !p.inline() {
        return Ok(None);
    }
    let mut data = vec![0u8; p.size as usize];
    s.mr.read(0, &mut data).map_err(|e| e.to_string())?;
    Ok(Some(data))
}
