//! Address handles: `ibv_create_ah`, `ibv_destroy_ah`, and the ones built
//! from a UD receive (`ibv_init_ah_from_wc`, `ibv_create_ah_from_wc`).

use crate::abi::convert::av_from_c;
use crate::abi::*;
use crate::context::context;
use crate::object::{container_of, destroy, hand_out, Used};
use crate::pd::RoxePd;
use crate::{fail_minus_one, fail_null, guard};
use std::ffi::c_int;
use std::mem::zeroed;
use std::ptr::null_mut;

#[repr(C)]
pub(crate) struct RoxeAh {
    c: ibv_ah,
    pub(crate) ah: roxe_verbs::Ah,
    _pd: Used<RoxePd>,
}

/// # Safety
/// `pd` is NULL or a live PD (of this library or the system's); `attr` is
/// NULL or the caller's.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    crate::passthrough::pass_through!(
        object pd,
        "ibv_create_ah",
        fn(*mut ibv_pd, *mut ibv_ah_attr) -> *mut ibv_ah,
        (pd, attr),
        null_mut()
    );
    guard(null_mut(), || {
        // SAFETY: pd NULL or ours; attr the caller's.
        let (Some(p), Some(a)) = (unsafe { container_of::<RoxePd, _>(pd) }, unsafe {
            attr.as_ref()
        }) else {
            return fail_null(libc::EINVAL);
        };
        match p.pd.create_ah(&av_from_c(a)) {
            Ok(ah) => hand_out(RoxeAh {
                c: ibv_ah {
                    context: p.context(),
                    pd,
                    handle: 0,
                },
                ah,
                _pd: Used::new(p),
            })
            .cast(),
            Err(e) => fail_null(e.errno()),
        }
    })
}

/// # Safety
/// `ah` is NULL or a live AH (of this library or the system's), not used
/// again once destroyed.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    crate::passthrough::pass_through!(
        object ah,
        "ibv_destroy_ah",
        fn(*mut ibv_ah) -> c_int,
        (ah),
        libc::EOPNOTSUPP
    );
    // SAFETY: per the contract.
    unsafe { destroy(ah, |_: &RoxeAh| Ok(())) }
}

/// The sender's GID from the GRH area of a UD receive: an IPv4 header in
/// bytes 20..40 (RoCEv2 over IPv4, recognised by its valid checksum), or
/// an IPv6 header.
fn sgid_of_grh(g: &[u8; 40]) -> Option<[u8; 16]> {
    let v4 = &g[20..40];
    if v4[0] == 0x45 && ipv4_checksum_ok(v4) {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&v4[12..16]);
        return Some(gid);
    }
    if g[0] >> 4 == 6 {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&g[8..24]);
        return Some(gid);
    }
    None
}

fn ipv4_checksum_ok(h: &[u8]) -> bool {
    let mut sum = 0u32;
    for c in h.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum == 0xffff
}

/// # Safety
/// `ctx` is NULL or an open context (of this library or the system's);
/// `wc` and `ah_attr` are NULL or the caller's; with `IBV_WC_GRH` in the
/// completion, `grh` points to the 40-byte GRH area of its receive buffer.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    crate::passthrough::pass_through!(
        context ctx,
        "ibv_init_ah_from_wc",
        fn(*mut ibv_context, u8, *mut ibv_wc, *mut ibv_grh, *mut ibv_ah_attr) -> c_int,
        (ctx, port_num, wc, grh, ah_attr),
        libc::EOPNOTSUPP
    );
    guard(-1, || {
        // SAFETY: all three are the caller's (or NULL).
        let (Some(_), Some(wc), Some(out)) =
            (unsafe { context(ctx) }, unsafe { wc.as_ref() }, unsafe {
                ah_attr.as_mut()
            })
        else {
            return fail_minus_one(libc::EINVAL);
        };
        let mut a = ibv_ah_attr {
            dlid: wc.slid,
            sl: wc.sl,
            src_path_bits: wc.dlid_path_bits,
            port_num,
            ..ibv_ah_attr::default()
        };
        if wc.wc_flags & IBV_WC_GRH != 0 {
            if grh.is_null() {
                return fail_minus_one(libc::EINVAL);
            }
            // SAFETY: with IBV_WC_GRH the first 40 bytes of the receive
            // buffer, which grh points to, hold the GRH area.
            let g = unsafe { &*grh.cast::<[u8; 40]>() };
            let Some(sgid) = sgid_of_grh(g) else {
                return fail_minus_one(libc::EINVAL);
            };
            a.is_global = 1;
            a.grh.dgid = ibv_gid { raw: sgid };
            a.grh.sgid_index = 0;
            a.grh.hop_limit = 0xff;
        }
        *out = a;
        0
    })
}

/// # Safety
/// `pd` is NULL or a live PD (of this library or the system's); `wc` and
/// `grh` as for [`ibv_init_ah_from_wc`].
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    crate::passthrough::pass_through!(
        object pd,
        "ibv_create_ah_from_wc",
        fn(*mut ibv_pd, *mut ibv_wc, *mut ibv_grh, u8) -> *mut ibv_ah,
        (pd, wc, grh, port_num),
        null_mut()
    );
    // SAFETY: pd NULL or ours.
    let Some(p) = (unsafe { container_of::<RoxePd, _>(pd) }) else {
        return fail_null(libc::EINVAL);
    };
    // SAFETY: plain data.
    let mut a: ibv_ah_attr = unsafe { zeroed() };
    // SAFETY: forwarded contract; a is a valid out-struct.
    if unsafe { ibv_init_ah_from_wc(p.context(), port_num, wc, grh, &mut a) } != 0 {
        return null_mut();
    }
    // SAFETY: forwarded contract.
    unsafe { ibv_create_ah(pd, &mut a) }
}
