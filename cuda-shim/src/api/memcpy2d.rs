//! Pitched memory: `cuMemAllocPitch`, 2D and 3D copies (`cuMemcpy2D`, `cuMemcpy3D` and
//! their `Async` and `Unaligned` forms) and 2D memsets. Copies run as row copies on the
//! vGPU's copy operations (one request per row, one for the whole block when rows are
//! contiguous on both sides), memsets as row memsets; the whole range of each side is
//! checked before anything runs (device sides against one live allocation). Arrays (a
//! memory type of `CU_MEMORYTYPE_ARRAY`) are not offered: `CUDA_ERROR_NOT_SUPPORTED`.

use std::ffi::{c_uchar, c_uint, c_ushort, c_void};

use crate::driver::{self, Driver, Res};
use crate::extra::{Op, Side, Strided};
use crate::types::{
    res, CUdeviceptr, CUresult, CUstream, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST,
};
use crate::{guard, out};

/// `CU_MEMORYTYPE_ARRAY`, `CU_MEMORYTYPE_UNIFIED`.
const CU_MEMORYTYPE_ARRAY: c_uint = 3;
const CU_MEMORYTYPE_UNIFIED: c_uint = 4;
/// The largest pitch (`CU_DEVICE_ATTRIBUTE_MAX_PITCH`).
const MAX_PITCH: u64 = i32::MAX as u64;
/// `cuMemAllocPitch` rounds the pitch up to this.
const PITCH_ALIGN: u64 = 512;

/// `CUDA_MEMCPY2D`.
#[repr(C)]
pub struct Memcpy2d {
    pub src_x: usize,
    pub src_y: usize,
    pub src_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub src_pitch: usize,
    pub dst_x: usize,
    pub dst_y: usize,
    pub dst_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub dst_pitch: usize,
    pub width: usize,
    pub height: usize,
}

/// `CUDA_MEMCPY3D`.
#[repr(C)]
pub struct Memcpy3d {
    pub src_x: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub reserved0: *mut c_void,
    pub src_pitch: usize,
    pub src_height: usize,
    pub dst_x: usize,
    pub dst_y: usize,
    pub dst_z: usize,
    pub dst_lod: usize,
    pub dst_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub reserved1: *mut c_void,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// One side of a copy as the program describes it.
struct SideSpec {
    kind: c_uint,
    host: usize,
    device: u64,
    x: u64,
    y: u64,
    z: u64,
    pitch: u64,
    /// Rows per slice (3D only; the copy's height for 2D).
    rows: u64,
}

fn checked(v: Option<u64>) -> Res<u64> {
    v.ok_or(res::INVALID_VALUE)
}

/// The side's first byte, and its rows' and slices' strides, checked: a pitch below the
/// row (when there is more than one), above the device's limit, or a range past the end
/// of the address space answer `CUDA_ERROR_INVALID_VALUE`; a device side must lie in one
/// live allocation.
fn resolve(d: &Driver, s: &SideSpec, width: u64, height: u64, depth: u64) -> Res<(Side, u64, u64)> {
    if s.kind == CU_MEMORYTYPE_ARRAY {
        crate::api::stubs::log_once("CUDA arrays (copies to or from an array)");
        return Err(res::NOT_SUPPORTED);
    }
    let device = match s.kind {
        CU_MEMORYTYPE_HOST => false,
        CU_MEMORYTYPE_DEVICE => true,
        // A unified address: device memory when it lies in an allocation.
        CU_MEMORYTYPE_UNIFIED => d.alloc_of(s.device).is_some(),
        _ => return Err(res::INVALID_VALUE),
    };
    if s.pitch > MAX_PITCH {
        return Err(res::INVALID_VALUE);
    }
    let row_end = checked(s.x.checked_add(width))?;
    if (height > 1 || depth > 1) && s.pitch < row_end {
        return Err(res::INVALID_VALUE);
    }
    let slice = checked(s.pitch.checked_mul(s.rows))?;
    if depth > 1 && s.rows < s.y.saturating_add(height) {
        return Err(res::INVALID_VALUE);
    }
    // Offset of the first byte, and the span from it to the last byte.
    let first = checked(
        s.z.checked_mul(slice)
            .and_then(|a| a.checked_add(s.y.checked_mul(s.pitch)?))
            .and_then(|a| a.checked_add(s.x)),
    )?;
    let span = checked(
        (depth - 1)
            .checked_mul(slice)
            .and_then(|a| a.checked_add((height - 1).checked_mul(s.pitch)?))
            .and_then(|a| a.checked_add(width)),
    )?;
    if device {
        let at = checked(s.device.checked_add(first))?;
        d.check_device(at, span)?;
        Ok((Side::Device(at), s.pitch, slice))
    } else {
        let base = if s.kind == CU_MEMORYTYPE_UNIFIED {
            s.device as usize
        } else {
            s.host
        };
        if base == 0 {
            return Err(res::INVALID_VALUE);
        }
        let at = checked((base as u64).checked_add(first))?;
        checked(at.checked_add(span))?;
        Ok((Side::Host(at as usize), s.pitch, slice))
    }
}

/// A checked 3D copy.
fn strided(
    d: &Driver,
    src: &SideSpec,
    dst: &SideSpec,
    width: usize,
    height: usize,
    depth: usize,
) -> Res<Option<Strided>> {
    if width == 0 || height == 0 || depth == 0 {
        return Ok(None);
    }
    let (w, h, z) = (width as u64, height as u64, depth as u64);
    let (s, sp, ss) = resolve(d, src, w, h, z)?;
    let (t, dp, ds) = resolve(d, dst, w, h, z)?;
    Ok(Some(Strided {
        src: s,
        dst: t,
        src_pitch: sp,
        dst_pitch: dp,
        src_slice: ss,
        dst_slice: ds,
        width,
        height,
        depth,
    }))
}

fn spec2d(p: &Memcpy2d) -> (SideSpec, SideSpec) {
    (
        SideSpec {
            kind: p.src_type,
            host: p.src_host as usize,
            device: p.src_device,
            x: p.src_x as u64,
            y: p.src_y as u64,
            z: 0,
            pitch: p.src_pitch as u64,
            rows: p.src_y.saturating_add(p.height) as u64,
        },
        SideSpec {
            kind: p.dst_type,
            host: p.dst_host as usize,
            device: p.dst_device,
            x: p.dst_x as u64,
            y: p.dst_y as u64,
            z: 0,
            pitch: p.dst_pitch as u64,
            rows: p.dst_y.saturating_add(p.height) as u64,
        },
    )
}

fn spec3d(p: &Memcpy3d) -> Res<(SideSpec, SideSpec)> {
    if p.src_lod != 0 || p.dst_lod != 0 {
        return Err(res::INVALID_VALUE);
    }
    Ok((
        SideSpec {
            kind: p.src_type,
            host: p.src_host as usize,
            device: p.src_device,
            x: p.src_x as u64,
            y: p.src_y as u64,
            z: p.src_z as u64,
            pitch: p.src_pitch as u64,
            rows: p.src_height as u64,
        },
        SideSpec {
            kind: p.dst_type,
            host: p.dst_host as usize,
            device: p.dst_device,
            x: p.dst_x as u64,
            y: p.dst_y as u64,
            z: p.dst_z as u64,
            pitch: p.dst_pitch as u64,
            rows: p.dst_height as u64,
        },
    ))
}

/// The operations of a `CUDA_MEMCPY3D` (for a graph's copy node).
pub(crate) fn copy3d_ops(d: &Driver, p: &Memcpy3d) -> Res<Vec<Op>> {
    let (s, t) = spec3d(p)?;
    Ok(strided(d, &s, &t, p.width, p.height, p.depth)?
        .map(Op::Strided)
        .into_iter()
        .collect())
}

fn row_copy(d: &mut Driver, src: Side, dst: Side, len: usize, s: Option<CUstream>) -> Res<()> {
    use super::copy::{dtod_in, dtoh_in, htod_in};
    match (src, dst) {
        (Side::Host(a), Side::Device(b)) => htod_in(d, b, a as *const c_void, len, s),
        (Side::Device(a), Side::Host(b)) => dtoh_in(d, b as *mut c_void, a, len, s),
        (Side::Device(a), Side::Device(b)) => dtod_in(d, b, a, len, s),
        (Side::Host(a), Side::Host(b)) => {
            // Host to host, in stream order: after the stream's earlier work.
            let q = d.stream_queue(s.map_or(0, |h| h as usize))?.0;
            let t = d.t.clone();
            d.queue(q)?.wait_all_quiet(&t);
            // SAFETY: both ranges were checked non-NULL and hold `len` bytes (API
            // contract); `copy` allows them to overlap.
            unsafe { std::ptr::copy(a as *const u8, b as *mut u8, len) };
            Ok(())
        }
    }
}

fn offset(side: Side, by: u64) -> Side {
    match side {
        Side::Host(a) => Side::Host(a + by as usize),
        Side::Device(a) => Side::Device(a + by),
    }
}

/// Runs a checked strided copy on stream `s` (None: synchronously).
pub(crate) fn run_strided(d: &mut Driver, c: &Strided, s: Option<CUstream>) -> Res<()> {
    let w = c.width as u64;
    let rows_contiguous = c.src_pitch == w && c.dst_pitch == w;
    let h = c.height as u64;
    if rows_contiguous && c.src_slice == w * h && c.dst_slice == w * h {
        return row_copy(d, c.src, c.dst, c.width * c.height * c.depth, s);
    }
    for z in 0..c.depth as u64 {
        let (sz, dz) = (
            offset(c.src, z * c.src_slice),
            offset(c.dst, z * c.dst_slice),
        );
        if rows_contiguous {
            row_copy(d, sz, dz, c.width * c.height, s)?;
            continue;
        }
        for y in 0..h {
            row_copy(
                d,
                offset(sz, y * c.src_pitch),
                offset(dz, y * c.dst_pitch),
                c.width,
                s,
            )?;
        }
    }
    Ok(())
}

fn copy(src: SideSpec, dst: SideSpec, dims: [usize; 3], s: Option<CUstream>) -> Res<()> {
    driver::with(|d| {
        d.current_ctx()?;
        let h = s.map_or(0, |h| h as usize);
        d.stream_queue(h)?;
        let Some(c) = strided(d, &src, &dst, dims[0], dims[1], dims[2])? else {
            return Ok(());
        };
        if super::graph::record(d, h, || Op::Strided(c))? {
            return Ok(());
        }
        run_strided(d, &c, s)
    })
}

fn copy2d(p: *const Memcpy2d, s: Option<CUstream>) -> Res<()> {
    if p.is_null() {
        return Err(res::INVALID_VALUE);
    }
    // SAFETY: a readable CUDA_MEMCPY2D from the caller.
    let p = unsafe { &*p };
    let (src, dst) = spec2d(p);
    copy(src, dst, [p.width, p.height, 1], s)
}

fn copy3d(p: *const Memcpy3d, s: Option<CUstream>) -> Res<()> {
    if p.is_null() {
        return Err(res::INVALID_VALUE);
    }
    // SAFETY: a readable CUDA_MEMCPY3D from the caller.
    let p = unsafe { &*p };
    let (src, dst) = spec3d(p)?;
    copy(src, dst, [p.width, p.height, p.depth], s)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2D_v2(p: *const Memcpy2d) -> CUresult {
    guard("cuMemcpy2D_v2", || copy2d(p, None))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(p: *const Memcpy2d) -> CUresult {
    guard("cuMemcpy2DUnaligned_v2", || copy2d(p, None))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(p: *const Memcpy2d, s: CUstream) -> CUresult {
    guard("cuMemcpy2DAsync_v2", || copy2d(p, Some(s)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3D_v2(p: *const Memcpy3d) -> CUresult {
    guard("cuMemcpy3D_v2", || copy3d(p, None))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpy3DAsync_v2(p: *const Memcpy3d, s: CUstream) -> CUresult {
    guard("cuMemcpy3DAsync_v2", || copy3d(p, Some(s)))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    ppitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    guard("cuMemAllocPitch_v2", || {
        if dptr.is_null() || ppitch.is_null() || width == 0 || height == 0 {
            return Err(res::INVALID_VALUE);
        }
        if !matches!(elem, 4 | 8 | 16) {
            return Err(res::INVALID_VALUE);
        }
        let pitch = checked((width as u64).checked_next_multiple_of(PITCH_ALIGN))?;
        if pitch > MAX_PITCH {
            return Err(res::INVALID_VALUE);
        }
        let size = checked(pitch.checked_mul(height as u64))?;
        let size = usize::try_from(size).map_err(|_| res::INVALID_VALUE)?;
        let mut p: CUdeviceptr = 0;
        // SAFETY: a local out pointer.
        match unsafe { super::memory::cuMemAlloc_v2(&mut p, size) } {
            res::SUCCESS => {}
            e => return Err(e),
        }
        // SAFETY: both checked non-null; writable from the caller.
        unsafe {
            out(dptr, p)?;
            out(ppitch, pitch as usize)
        }
    })
}

/// A checked pitched memset: `height` rows of `width` elements of `elem` bytes.
pub(crate) fn memset2d_op(
    d: &Driver,
    dst: u64,
    pitch: usize,
    value: u32,
    width: usize,
    height: usize,
    elem: u32,
) -> Res<Op> {
    if !matches!(elem, 1 | 2 | 4) || dst % u64::from(elem) != 0 {
        return Err(res::INVALID_VALUE);
    }
    let row = checked((width as u64).checked_mul(u64::from(elem)))?;
    if (height > 1 && (pitch as u64) < row) || pitch as u64 > MAX_PITCH {
        return Err(res::INVALID_VALUE);
    }
    if width > 0 && height > 0 {
        let span = checked(
            ((height - 1) as u64)
                .checked_mul(pitch as u64)
                .and_then(|a| a.checked_add(row)),
        )?;
        d.check_device(dst, span)?;
    }
    Ok(Op::Memset2d {
        dst,
        pitch,
        value,
        width,
        height,
        elem,
    })
}

fn memset2d(
    dst: u64,
    pitch: usize,
    value: u32,
    width: usize,
    height: usize,
    elem: u32,
    s: Option<CUstream>,
) -> Res<()> {
    driver::with(|d| {
        d.current_ctx()?;
        let h = s.map_or(0, |h| h as usize);
        d.stream_queue(h)?;
        let op = memset2d_op(d, dst, pitch, value, width, height, elem)?;
        if width == 0 || height == 0 {
            return Ok(());
        }
        if super::graph::record(d, h, || op.clone())? {
            return Ok(());
        }
        if pitch as u64 == width as u64 * u64::from(elem) {
            let count = width.checked_mul(height).ok_or(res::INVALID_VALUE)?;
            return super::copy::memset_in(d, dst, value, count, elem, s);
        }
        for row in 0..height {
            let at = dst + (row * pitch) as u64;
            super::copy::memset_in(d, at, value, width, elem, s)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD2D8_v2(
    dst: CUdeviceptr,
    pitch: usize,
    v: c_uchar,
    width: usize,
    height: usize,
) -> CUresult {
    guard("cuMemsetD2D8_v2", || {
        memset2d(dst, pitch, u32::from(v), width, height, 1, None)
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD2D16_v2(
    dst: CUdeviceptr,
    pitch: usize,
    v: c_ushort,
    width: usize,
    height: usize,
) -> CUresult {
    guard("cuMemsetD2D16_v2", || {
        memset2d(dst, pitch, u32::from(v), width, height, 2, None)
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD2D32_v2(
    dst: CUdeviceptr,
    pitch: usize,
    v: c_uint,
    width: usize,
    height: usize,
) -> CUresult {
    guard("cuMemsetD2D32_v2", || {
        memset2d(dst, pitch, v, width, height, 4, None)
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD2D8Async(
    dst: CUdeviceptr,
    pitch: usize,
    v: c_uchar,
    width: usize,
    height: usize,
    s: CUstream,
) -> CUresult {
    guard("cuMemsetD2D8Async", || {
        memset2d(dst, pitch, u32::from(v), width, height, 1, Some(s))
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD2D16Async(
    dst: CUdeviceptr,
    pitch: usize,
    v: c_ushort,
    width: usize,
    height: usize,
    s: CUstream,
) -> CUresult {
    guard("cuMemsetD2D16Async", || {
        memset2d(dst, pitch, u32::from(v), width, height, 2, Some(s))
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD2D32Async(
    dst: CUdeviceptr,
    pitch: usize,
    v: c_uint,
    width: usize,
    height: usize,
    s: CUstream,
) -> CUresult {
    guard("cuMemsetD2D32Async", || {
        memset2d(dst, pitch, v, width, height, 4, Some(s))
    })
}
