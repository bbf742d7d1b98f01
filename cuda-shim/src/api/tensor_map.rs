//! TMA tensor maps: `cuTensorMapEncodeTiled`, `cuTensorMapEncodeIm2col` and
//! `cuTensorMapReplaceAddress`. The 128-byte `CUtensorMap` is the GPU driver's own
//! format, so the library does not build it: it checks the parameters as the driver
//! documents them, then the worker's GPU driver encodes the map (`ENCODE_TENSOR_MAP`,
//! capability `TENSOR_MAPS`). A vGPU's device addresses are the GPU's own virtual
//! addresses in the worker, so that descriptor is valid in this program's kernels, and
//! stays so across migration. A device without the capability (sim, a GPU below compute
//! capability 9.0) answers `CUDA_ERROR_NOT_SUPPORTED`, as does `cuDeviceGetAttribute`'s
//! `TENSOR_MAP_ACCESS_SUPPORTED` (0).

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use vgpu_proto::{features, tensor_map_kind, TensorMapArgs, MAX_TENSOR_RANK, TENSOR_MAP_BYTES};

use crate::driver;
use crate::guard;
use crate::types::{res, CUresult};

/// Most descriptors whose parameters are remembered for `cuTensorMapReplaceAddress`; the
/// oldest are forgotten first.
const REMEMBERED: usize = 4096;

/// The parameters of each descriptor this library encoded, by its bytes (a program copies
/// descriptors freely: into kernel parameters, constant memory, its own structs).
#[derive(Default)]
struct Remembered {
    params: HashMap<[u8; TENSOR_MAP_BYTES], TensorMapArgs>,
    order: VecDeque<[u8; TENSOR_MAP_BYTES]>,
}

impl Remembered {
    fn insert(&mut self, bytes: [u8; TENSOR_MAP_BYTES], map: TensorMapArgs) {
        if self.params.insert(bytes, map).is_none() {
            self.order.push_back(bytes);
        }
        while self.order.len() > REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.params.remove(&old);
            }
        }
    }
}

static REMEMBER: Mutex<Option<Remembered>> = Mutex::new(None);

fn remember(bytes: [u8; TENSOR_MAP_BYTES], map: TensorMapArgs) {
    let mut r = REMEMBER.lock().unwrap_or_else(|e| e.into_inner());
    r.get_or_insert_with(Remembered::default).insert(bytes, map);
}

fn recall(bytes: &[u8; TENSOR_MAP_BYTES]) -> Option<TensorMapArgs> {
    let r = REMEMBER.lock().unwrap_or_else(|e| e.into_inner());
    r.as_ref().and_then(|r| r.params.get(bytes).copied())
}

/// `n` entries of the caller's array (`[]` for none; NULL with entries is refused).
///
/// # Safety
/// A non-null `p` points to at least `n` readable `T`s.
unsafe fn entries<T: Copy + Default, const N: usize>(
    p: *const T,
    n: usize,
) -> Result<[T; N], CUresult> {
    let mut out = [T::default(); N];
    if n == 0 {
        return Ok(out);
    }
    if p.is_null() || n > N {
        return Err(res::INVALID_VALUE);
    }
    // SAFETY: non-null, and `n` entries readable by the caller's contract; n <= N.
    let src = unsafe { std::slice::from_raw_parts(p, n) };
    out[..n].copy_from_slice(src);
    Ok(out)
}

/// The output descriptor: non-null and aligned as the driver demands (64 bytes).
fn check_out(tensor_map: *mut c_void) -> Result<(), CUresult> {
    if tensor_map.is_null() || tensor_map as usize % 64 != 0 {
        return Err(res::INVALID_VALUE);
    }
    Ok(())
}

/// Checks `map`, has the worker encode it, writes it to `tensor_map` and remembers it.
fn encode(tensor_map: *mut c_void, map: TensorMapArgs) -> Result<(), CUresult> {
    check_out(tensor_map)?;
    map.check().map_err(|e| {
        tracing::debug!(error = %e, "tensor map refused");
        res::INVALID_VALUE
    })?;
    let bytes = driver::with(|d| {
        d.current_ctx()?;
        if d.info.features & features::TENSOR_MAPS == 0 {
            crate::api::stubs::log_once(
                "TMA tensor maps on a vGPU without them (a sim vGPU, or a GPU below compute capability 9.0)",
            );
            return Err(res::NOT_SUPPORTED);
        }
        let t = d.t.clone();
        d.queue(0)?.call(&t, |s| s.encode_tensor_map(&map))
    })?;
    // SAFETY: checked non-null and 64-byte aligned; the caller passes a writable
    // CUtensorMap (128 bytes).
    unsafe { tensor_map.cast::<[u8; TENSOR_MAP_BYTES]>().write(bytes) };
    remember(bytes, map);
    Ok(())
}

/// The rank a caller passed, within what the arrays may hold.
fn rank_of(rank: c_uint) -> Result<usize, CUresult> {
    if rank == 0 || rank > MAX_TENSOR_RANK {
        return Err(res::INVALID_VALUE);
    }
    Ok(rank as usize)
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuTensorMapEncodeTiled(
    tensor_map: *mut c_void,
    data_type: c_uint,
    rank: c_uint,
    global_address: *mut c_void,
    global_dim: *const u64,
    global_strides: *const u64,
    box_dim: *const u32,
    element_strides: *const u32,
    interleave: c_uint,
    swizzle: c_uint,
    l2_promotion: c_uint,
    oob_fill: c_uint,
) -> CUresult {
    guard("cuTensorMapEncodeTiled", || {
        let n = rank_of(rank)?;
        // SAFETY: the caller passes arrays of `rank` (strides: rank - 1) entries.
        let map = unsafe {
            TensorMapArgs {
                kind: tensor_map_kind::TILED,
                data_type,
                rank,
                interleave,
                swizzle,
                l2_promotion,
                oob_fill,
                flags: 0,
                global_address: global_address as u64,
                global_dim: entries(global_dim, n)?,
                global_strides: entries(global_strides, n - 1)?,
                box_dim: entries(box_dim, n)?,
                element_strides: entries(element_strides, n)?,
                ..TensorMapArgs::default()
            }
        };
        encode(tensor_map, map)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuTensorMapEncodeIm2col(
    tensor_map: *mut c_void,
    data_type: c_uint,
    rank: c_uint,
    global_address: *mut c_void,
    global_dim: *const u64,
    global_strides: *const u64,
    pixel_box_lower: *const c_int,
    pixel_box_upper: *const c_int,
    channels_per_pixel: c_uint,
    pixels_per_column: c_uint,
    element_strides: *const u32,
    interleave: c_uint,
    swizzle: c_uint,
    l2_promotion: c_uint,
    oob_fill: c_uint,
) -> CUresult {
    guard("cuTensorMapEncodeIm2col", || {
        let n = rank_of(rank)?;
        if n < 3 {
            return Err(res::INVALID_VALUE);
        }
        // SAFETY: the caller passes arrays of `rank` (strides: rank - 1, corners: rank - 2)
        // entries.
        let map = unsafe {
            TensorMapArgs {
                kind: tensor_map_kind::IM2COL,
                data_type,
                rank,
                interleave,
                swizzle,
                l2_promotion,
                oob_fill,
                flags: 0,
                global_address: global_address as u64,
                global_dim: entries(global_dim, n)?,
                global_strides: entries(global_strides, n - 1)?,
                element_strides: entries(element_strides, n)?,
                pixel_box_lower: entries(pixel_box_lower, n - 2)?,
                pixel_box_upper: entries(pixel_box_upper, n - 2)?,
                channels_per_pixel,
                pixels_per_column,
                ..TensorMapArgs::default()
            }
        };
        encode(tensor_map, map)
    })
}

/// Re-encodes a descriptor this library encoded (known by its bytes) for a new address;
/// one it did not encode (or has forgotten: it keeps the latest 4096) answers
/// `CUDA_ERROR_NOT_SUPPORTED`, logged once.
#[no_mangle]
pub unsafe extern "C" fn cuTensorMapReplaceAddress(
    tensor_map: *mut c_void,
    global_address: *mut c_void,
) -> CUresult {
    guard("cuTensorMapReplaceAddress", || {
        check_out(tensor_map)?;
        // SAFETY: checked non-null and aligned; the caller passes a CUtensorMap.
        let bytes = unsafe { tensor_map.cast::<[u8; TENSOR_MAP_BYTES]>().read() };
        let Some(map) = recall(&bytes) else {
            crate::api::stubs::log_once(
                "cuTensorMapReplaceAddress of a tensor map this library did not encode",
            );
            return Err(res::NOT_SUPPORTED);
        };
        encode(
            tensor_map,
            TensorMapArgs {
                global_address: global_address as u64,
                ..map
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(i: usize) -> [u8; TENSOR_MAP_BYTES] {
        let mut b = [0u8; TENSOR_MAP_BYTES];
        b[..8].copy_from_slice(&(i as u64).to_le_bytes());
        b
    }

    #[test]
    fn the_latest_descriptors_are_remembered_and_the_oldest_forgotten() {
        let mut r = Remembered::default();
        for i in 0..=REMEMBERED {
            let map = TensorMapArgs {
                global_address: i as u64 * 16,
                ..TensorMapArgs::default()
            };
            r.insert(bytes(i), map);
        }
        assert_eq!(r.params.len(), REMEMBERED);
        assert!(!r.params.contains_key(&bytes(0)), "the oldest is forgotten");
        assert_eq!(
            r.params.get(&bytes(REMEMBERED)).map(|m| m.global_address),
            Some(REMEMBERED as u64 * 16)
        );
        // Encoding the same bytes again replaces the parameters, not the order.
        let again = TensorMapArgs {
            rank: 2,
            ..TensorMapArgs::default()
        };
        r.insert(bytes(1), again);
        assert_eq!(r.order.len(), REMEMBERED);
        assert_eq!(r.params.get(&bytes(1)).map(|m| m.rank), Some(2));
    }
}
