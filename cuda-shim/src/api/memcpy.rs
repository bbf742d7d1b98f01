//! Unified copies (`cuMemcpy`, `cuMemcpyAsync`: the direction from where each address
//! lies, as unified addressing lets the driver tell) and peer copies (`cuMemcpyPeer`,
//! `cuMemcpyPeerAsync`: the vGPU is one device, so a copy between two of its contexts is
//! a device-to-device copy).

use crate::driver::{self, Driver, Res};
use crate::extra::{Op, Side, Strided};
use crate::guard;
use crate::types::{res, CUcontext, CUdeviceptr, CUresult, CUstream};

/// Where a unified address lies: device memory when it is in an allocation, else host.
fn side(d: &Driver, p: u64) -> Res<Side> {
    if d.alloc_of(p).is_some() {
        return Ok(Side::Device(p));
    }
    if p == 0 {
        return Err(res::INVALID_VALUE);
    }
    Ok(Side::Host(p as usize))
}

fn unified(dst: u64, src: u64, n: usize, s: Option<CUstream>) -> Res<()> {
    driver::with(|d| {
        d.current_ctx()?;
        let h = s.map_or(0, |h| h as usize);
        d.stream_queue(h)?;
        if n == 0 {
            return Ok(());
        }
        let (to, from) = (side(d, dst)?, side(d, src)?);
        for (side, at) in [(to, dst), (from, src)] {
            if matches!(side, Side::Device(_)) {
                d.check_device(at, n as u64)?;
            } else if at.checked_add(n as u64).is_none() {
                return Err(res::INVALID_VALUE);
            }
        }
        let c = Strided {
            src: from,
            dst: to,
            src_pitch: n as u64,
            dst_pitch: n as u64,
            src_slice: n as u64,
            dst_slice: n as u64,
            width: n,
            height: 1,
            depth: 1,
        };
        if super::graph::record(d, h, || Op::Strided(c))? {
            return Ok(());
        }
        super::memcpy2d::run_strided(d, &c, s)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    guard("cuMemcpy", || unified(dst, src, n, None))
}

#[no_mangle]
pub extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    guard("cuMemcpyAsync", || unified(dst, src, n, Some(s)))
}

fn peer(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
    s: Option<CUstream>,
) -> Res<()> {
    driver::with(|d| {
        for c in [dst_ctx, src_ctx] {
            if !d.contexts.contains_key(&(c as u64)) {
                return Err(res::INVALID_CONTEXT);
            }
        }
        super::copy::dtod_in(d, dst, src, n, s)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyPeer(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
) -> CUresult {
    guard("cuMemcpyPeer", || peer(dst, dst_ctx, src, src_ctx, n, None))
}

#[no_mangle]
pub extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
    s: CUstream,
) -> CUresult {
    guard("cuMemcpyPeerAsync", || {
        peer(dst, dst_ctx, src, src_ctx, n, Some(s))
    })
}
