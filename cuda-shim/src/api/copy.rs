//! Copies and memsets. Host memory from the DMA pool (`cuMemAllocHost`, `cuMemHostAlloc`)
//! is copied zero-copy; any other host memory bounces through DMA memory: a staging buffer
//! for synchronous copies, a private copy of the source for asynchronous host-to-device
//! copies (so the call returns at once, as CUDA does for pageable memory), and a
//! synchronous copy for device-to-host into pageable memory (as CUDA does).

use std::ffi::{c_uchar, c_uint, c_ushort, c_void};

use guest_driver::Transport;

use crate::driver::{self, Driver, Res, STAGING_BYTES};
use crate::extra::Op;
use crate::guard;
use crate::types::{res, CUdeviceptr, CUresult, CUstream};

/// (queue, legacy default stream, blocking) of a stream handle, ordered as CUDA requires
/// and checked against the current context.
fn target(d: &mut Driver, stream: Option<CUstream>) -> Res<usize> {
    let h = stream.map_or(0, |s| s as usize);
    d.stream_context(h)?;
    d.ordered_queue(h)
}

/// Whether the operation went into a stream capture instead of running (synchronous
/// calls run, as they are on no captured stream).
fn captured(d: &mut Driver, stream: Option<CUstream>, op: impl FnOnce() -> Op) -> Res<bool> {
    match stream {
        Some(s) => crate::api::graph::record(d, s as usize, op),
        None => crate::api::graph::record(d, 0, op),
    }
}

fn htod(dst: CUdeviceptr, src: *const c_void, len: usize, stream: Option<CUstream>) -> Res<()> {
    driver::with(|d| htod_in(d, dst, src, len, stream))
}

pub(crate) fn htod_in(
    d: &mut Driver,
    dst: CUdeviceptr,
    src: *const c_void,
    len: usize,
    stream: Option<CUstream>,
) -> Res<()> {
    let q = target(d, stream)?;
    if len == 0 {
        return Ok(());
    }
    if src.is_null() {
        return Err(res::INVALID_VALUE);
    }
    if let Some(pieces) = d.check_pieces(dst, len as u64)? {
        for (p, n) in pieces {
            let from = src.cast::<u8>().wrapping_add((p - dst) as usize);
            htod_in(d, p, from.cast(), n as usize, stream)?;
        }
        return Ok(());
    }
    if captured(d, stream, || Op::Htod {
        dst,
        src: src as usize,
        len,
    })? {
        return Ok(());
    }
    let t = d.t.clone();
    let src = src.cast::<u8>();
    if let Some(phys) = t.phys_range(src, len) {
        let mut queue = d.queue(q)?;
        if stream.is_some() {
            queue.enqueue(
                &t,
                // SAFETY: pool memory stays mapped; the program keeps it unchanged until
                // the copy completes (CUDA's rule for asynchronous copies).
                |s| unsafe { s.enqueue_htod(dst, phys, len as u64) },
                None,
            )?;
            queue.submit();
            return Ok(());
        }
        return queue.call(&t, |s| {
            // SAFETY: pool memory, unchanged while we wait for the copy below.
            let tk = unsafe { s.enqueue_htod(dst, phys, len as u64)? };
            s.submit();
            s.wait(tk).map(drop)
        });
    }
    if stream.is_some() {
        let mut region = t.dma_alloc(len, 64).map_err(|_| res::OUT_OF_MEMORY)?;
        // SAFETY: the program's source holds `len` readable bytes (API contract).
        let bytes = unsafe { std::slice::from_raw_parts(src, len) };
        region.as_mut_slice()[..len].copy_from_slice(bytes);
        let phys = region.phys();
        let mut queue = d.queue(q)?;
        queue.enqueue(
            &t,
            // SAFETY: the region is ours and lives until the request completes (`keep`).
            |s| unsafe { s.enqueue_htod(dst, phys, len as u64) },
            Some(region),
        )?;
        queue.submit();
        return Ok(());
    }
    let (stage, stage_phys) = d.staging()?;
    let mut queue = d.queue(q)?;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(STAGING_BYTES);
        // SAFETY: source: `len` readable bytes (API contract); staging: STAGING_BYTES
        // of our DMA memory, not in use by the device (every staged copy is waited for).
        unsafe { std::ptr::copy_nonoverlapping(src.add(off), stage, n) };
        queue.call(&t, |s| {
            // SAFETY: the staging buffer is unchanged until the wait below returns.
            let tk = unsafe { s.enqueue_htod(dst + off as u64, stage_phys, n as u64)? };
            s.submit();
            s.wait(tk).map(drop)
        })?;
        off += n;
    }
    Ok(())
}

fn dtoh(dst: *mut c_void, src: CUdeviceptr, len: usize, stream: Option<CUstream>) -> Res<()> {
    driver::with(|d| dtoh_in(d, dst, src, len, stream))
}

pub(crate) fn dtoh_in(
    d: &mut Driver,
    dst: *mut c_void,
    src: CUdeviceptr,
    len: usize,
    stream: Option<CUstream>,
) -> Res<()> {
    let q = target(d, stream)?;
    if len == 0 {
        return Ok(());
    }
    if dst.is_null() {
        return Err(res::INVALID_VALUE);
    }
    if let Some(pieces) = d.check_pieces(src, len as u64)? {
        for (p, n) in pieces {
            let to = dst.cast::<u8>().wrapping_add((p - src) as usize);
            dtoh_in(d, to.cast(), p, n as usize, stream)?;
        }
        return Ok(());
    }
    if captured(d, stream, || Op::Dtoh {
        dst: dst as usize,
        src,
        len,
    })? {
        return Ok(());
    }
    let t = d.t.clone();
    let dst = dst.cast::<u8>();
    if let Some(phys) = t.phys_range(dst, len) {
        let mut queue = d.queue(q)?;
        if stream.is_some() {
            queue.enqueue(
                &t,
                // SAFETY: pool memory stays mapped; the program leaves it alone until the
                // copy completes (CUDA's rule for asynchronous copies).
                |s| unsafe { s.enqueue_dtoh(phys, len as u64, src) },
                None,
            )?;
            queue.submit();
            return Ok(());
        }
        return queue.call(&t, |s| {
            // SAFETY: pool memory, not touched by us until the wait returns.
            let tk = unsafe { s.enqueue_dtoh(phys, len as u64, src)? };
            s.submit();
            s.wait(tk).map(drop)
        });
    }
    // Pageable destination: the copy completes before the call returns.
    d.queue(q)?.wait_all_quiet(&t);
    let (stage, stage_phys) = d.staging()?;
    let mut queue = d.queue(q)?;
    let mut off = 0;
    while off < len {
        let n = (len - off).min(STAGING_BYTES);
        queue.call(&t, |s| {
            // SAFETY: the staging buffer is read only after the wait below returns.
            let tk = unsafe { s.enqueue_dtoh(stage_phys, n as u64, src + off as u64)? };
            s.submit();
            s.wait(tk).map(drop)
        })?;
        // SAFETY: staging holds n bytes the device wrote; the destination holds `len`
        // writable bytes (API contract).
        unsafe { std::ptr::copy_nonoverlapping(stage, dst.add(off), n) };
        off += n;
    }
    Ok(())
}

fn dtod(dst: CUdeviceptr, src: CUdeviceptr, len: usize, stream: Option<CUstream>) -> Res<()> {
    driver::with(|d| dtod_in(d, dst, src, len, stream))
}

pub(crate) fn dtod_in(
    d: &mut Driver,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    stream: Option<CUstream>,
) -> Res<()> {
    let q = target(d, stream)?;
    if len == 0 {
        return Ok(());
    }
    let split_dst = d.check_pieces(dst, len as u64)?;
    let split_src = d.check_pieces(src, len as u64)?;
    if split_dst.is_some() || split_src.is_some() {
        // Pieces that each lie inside one mapping on both sides.
        let mut off = 0u64;
        while off < len as u64 {
            let room = |p: u64| d.alloc_of(p).map_or(0, |(b, a)| b + a.size - p);
            let n = room(dst + off).min(room(src + off)).min(len as u64 - off);
            if n == 0 {
                return Err(res::INVALID_VALUE);
            }
            dtod_in(d, dst + off, src + off, n as usize, stream)?;
            off += n;
        }
        return Ok(());
    }
    if captured(d, stream, || Op::Dtod { dst, src, len })? {
        return Ok(());
    }
    let t = d.t.clone();
    let mut queue = d.queue(q)?;
    if stream.is_some() {
        queue.enqueue(&t, |s| s.enqueue_dtod(dst, src, len as u64), None)?;
        queue.submit();
        Ok(())
    } else {
        queue.call(&t, |s| s.memcpy_dtod(dst, src, len as u64))
    }
}

fn memset(
    dst: CUdeviceptr,
    value: u32,
    count: usize,
    elem: u32,
    stream: Option<CUstream>,
) -> Res<()> {
    driver::with(|d| memset_in(d, dst, value, count, elem, stream)).inspect_err(|&code| {
        tracing::debug!(dst, count, elem, code, "memset refused");
    })
}

pub(crate) fn memset_in(
    d: &mut Driver,
    dst: CUdeviceptr,
    value: u32,
    count: usize,
    elem: u32,
    stream: Option<CUstream>,
) -> Res<()> {
    let q = target(d, stream)?;
    if count == 0 {
        return Ok(());
    }
    if dst % u64::from(elem) != 0 {
        return Err(res::INVALID_VALUE);
    }
    let bytes = (count as u64)
        .checked_mul(u64::from(elem))
        .ok_or(res::INVALID_VALUE)?;
    if let Some(pieces) = d.check_pieces(dst, bytes)? {
        // Mappings start and end on 2 MiB boundaries: every piece holds whole elements.
        for (p, n) in pieces {
            memset_in(d, p, value, (n / u64::from(elem)) as usize, elem, stream)?;
        }
        return Ok(());
    }
    if captured(d, stream, || Op::Memset {
        dst,
        value,
        count,
        elem,
    })? {
        return Ok(());
    }
    if stream.is_some() && super::fill::try_fill(d, dst, value, bytes, elem, q)? {
        return Ok(());
    }
    let t = d.t.clone();
    let mut queue = d.queue(q)?;
    if stream.is_some() {
        queue.enqueue(
            &t,
            |s| s.enqueue_memset(dst, value, count as u64, elem),
            None,
        )?;
        queue.submit();
        Ok(())
    } else {
        queue.call(&t, |s| s.memset(dst, value, count as u64, elem))
    }
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    guard("cuMemcpyHtoD_v2", || htod(dst, src, n, None))
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    s: CUstream,
) -> CUresult {
    guard("cuMemcpyHtoDAsync_v2", || htod(dst, src, n, Some(s)))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    guard("cuMemcpyDtoH_v2", || dtoh(dst, src, n, None))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    guard("cuMemcpyDtoHAsync_v2", || dtoh(dst, src, n, Some(s)))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    guard("cuMemcpyDtoD_v2", || dtod(dst, src, n, None))
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: CUstream,
) -> CUresult {
    guard("cuMemcpyDtoDAsync_v2", || dtod(dst, src, n, Some(s)))
}

#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, v: c_uchar, n: usize) -> CUresult {
    guard("cuMemsetD8_v2", || memset(dst, u32::from(v), n, 1, None))
}

#[no_mangle]
pub extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, v: c_ushort, n: usize) -> CUresult {
    guard("cuMemsetD16_v2", || memset(dst, u32::from(v), n, 2, None))
}

#[no_mangle]
pub extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) -> CUresult {
    guard("cuMemsetD32_v2", || memset(dst, v, n, 4, None))
}

#[no_mangle]
pub extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, v: c_uchar, n: usize, s: CUstream) -> CUresult {
    guard("cuMemsetD8Async", || {
        memset(dst, u32::from(v), n, 1, Some(s))
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD16Async(
    dst: CUdeviceptr,
    v: c_ushort,
    n: usize,
    s: CUstream,
) -> CUresult {
    guard("cuMemsetD16Async", || {
        memset(dst, u32::from(v), n, 2, Some(s))
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD32Async(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) -> CUresult {
    guard("cuMemsetD32Async", || memset(dst, v, n, 4, Some(s)))
}
